import LockstepExamples
import LockstepTool

// `lockstep`: the tool for the example domains — the same one call a user's tool makes — with the examples'
// demo, bench and journal load generators.
await LockstepToolMain.run(
    domains: Examples.domains,
    commandName: "lockstep",
    commands: [
        DemoCommand.self, DemoClientCommand.self, BenchCommand.self, BenchWorkerCommand.self, BenchDaemonCommand.self,
    ],
    journalCommands: [JournalAppendLoadCommand.self, JournalBenchRecoveryCommand.self]
)
