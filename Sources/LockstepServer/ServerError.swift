/// The daemon could not start or go on: what failed, and what to do.
public struct ServerError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, RawRepresentable {
        public var rawValue: String
        public init(rawValue: String) { self.rawValue = rawValue }
        /// A system call failed.
        public static let system = Code(rawValue: "system")
        /// An endpoint could not be bound.
        public static let bind = Code(rawValue: "bind")
        /// The journal could not be opened or recovered.
        public static let journal = Code(rawValue: "journal")
        /// The configuration cannot be served.
        public static let configuration = Code(rawValue: "configuration")
    }

    public var code: Code
    public var reason: String

    public init(code: Code, _ reason: String) {
        self.code = code
        self.reason = reason
    }

    public var description: String { reason }
}
