/// The daemon could not start or go on: what failed, and what to do.
public struct ServerError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What kind of failure: switch on the static members; new ones may be added, so keep a default.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private enum Base: String, Hashable, Sendable {
            case system = "system"
            case bind = "bind"
            case journal = "journal"
            case configuration = "configuration"
        }

        private let base: Base
        private init(_ base: Base) { self.base = base }

        /// A system call failed.
        public static let system = Code(.system)
        /// An endpoint could not be bound.
        public static let bind = Code(.bind)
        /// The journal could not be opened or recovered.
        public static let journal = Code(.journal)
        /// The configuration cannot be served.
        public static let configuration = Code(.configuration)

        /// The code's stable name, e.g. `unavailable`.
        public var description: String { base.rawValue }
    }

    /// What kind of failure, for programs.
    public var code: Code
    /// What failed, with which value, and what to do: for people.
    public var reason: String

    /// An error of kind `code`, explained by `reason`.
    public init(code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    /// The reason alone; the code is for programs.
    public var description: String { reason }
}
