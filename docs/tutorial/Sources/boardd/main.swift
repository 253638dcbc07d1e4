import Foundation
import Kanban
import LockstepServer

// The daemon: every flag of `lockstepd` (`boardd --help`), systemd notification, SIGTERM drains and exits 0.
//
// The board's one effect, a card moved into done, goes to a directory standing for an outside service
// (Board.Notifications): $BOARD_NOTIFICATIONS, or `notifications` in the data directory. The effect's id is its
// idempotency key, so a run the daemon repeats (after a crash, a failover) sends nothing twice; the receipt comes
// back as an action, applied once.
await LockstepDaemonMain.run(
    domains: [Board.self],
    effects: [
        EffectHandler(Board.self) { effect, context in
            let directory =
                ProcessInfo.processInfo.environment["BOARD_NOTIFICATIONS"] ?? "\(context.dataDirectory)/notifications"
            let receipt = try Board.Notifications(directory: directory).send(effect, key: context.id)
            guard case let .notify(card, _) = effect else { return [] }
            return [.notified(id: card, receipt: receipt)]
        }
    ]
)
