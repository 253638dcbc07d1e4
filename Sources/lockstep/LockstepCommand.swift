import ArgumentParser

@main
struct LockstepCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "lockstep",
        abstract: "Work with Lockstep stores: run actions through the example domains, run the demo.",
        discussion: """
            Exit codes:
              0   success
              1   the command failed (the message says why)
              3   an action was rejected by its domain's validator
              4   replay: two replicas diverged (the output names the seq)
              5   journal verify: the journal is damaged (the output names store, seq and what)
              64  bad usage: unknown option, missing argument
              65  bad input: an action or file that could not be read or decoded
              69  no daemon answered at the command endpoint
            """,
        subcommands: [
            RunCommand.self, DemoCommand.self, DemoClientCommand.self, ReplayCommand.self, ReplayChildSubcommand.self,
            JournalCommand.self,
            StatsCommand.self, KeygenCommand.self, DispatchCommand.self, StateCommand.self, TailCommand.self,
            BenchCommand.self, BenchWorkerCommand.self,
        ]
    )
}

/// The exit codes `lockstep --help` documents.
enum ExitCodes {
    static let rejected = ExitCode(3)
    static let diverged = ExitCode(4)
    static let badInput = ExitCode(65)
    static let unavailable = ExitCode(69)
}
