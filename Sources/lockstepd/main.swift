import LockstepExamples
import LockstepServer

// `lockstepd`: the daemon, hosting the example domains — the same one call a user's daemon makes.
await LockstepDaemonMain.run(domains: Examples.domains, commandName: "lockstepd")
