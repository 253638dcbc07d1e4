import Kanban
import LockstepServer

// The daemon: every flag of `lockstepd` (`boardd --help`), systemd notification, SIGTERM drains and exits 0.
await LockstepDaemonMain.run(domains: [Board.self])
