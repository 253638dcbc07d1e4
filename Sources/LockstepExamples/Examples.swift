import Lockstep

/// The seeds' apps, as the domains `lockstepd` hosts by default.
public enum Examples {
    /// Every example domain, in the order the CLI lists them.
    public static let domains: [any ActionGenerating.Type] = [
        Counter.self, Todos.self, Posts.self, Numbers.self, Reminders.self,
    ]

    /// The example domain called `name`, or `nil`.
    public static func domain(named name: String) -> (any ActionGenerating.Type)? {
        domains.first { $0.name == name }
    }
}
