import Foundation
import LockstepExamples
import LockstepServer

// `lockstepd`: the daemon, hosting the example domains — the same one call a user's daemon makes. The reminders'
// notifications go to a directory standing for an outside service: $LOCKSTEP_NOTIFICATIONS, or `notifications` in
// the data directory.
await LockstepDaemonMain.run(
    domains: Examples.domains,
    effects: [
        EffectHandler(Reminders.self) { effect, context in
            let directory =
                ProcessInfo.processInfo.environment["LOCKSTEP_NOTIFICATIONS"]
                ?? "\(context.dataDirectory)/notifications"
            let receipt = try Reminders.Notifications(directory: directory).send(effect, key: context.id)
            guard case let .notify(id, _) = effect else { return [] }
            return [.notified(id: id, receipt: receipt)]
        }
    ],
    commandName: "lockstepd"
)
