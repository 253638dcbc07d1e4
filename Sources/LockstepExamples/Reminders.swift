import Foundation
import Lockstep

/// Reminders that act on the world: the example of effects and timers (docs/effects.md). Adding one sets a timer
/// that flags it overdue at its due time; completing one cancels that timer and notifies an outside service, whose
/// receipt comes back as an action.
///
/// Actions on the wire: `{"add":{"text":"Call Ann","dueMilliseconds":1764234000000}}`, `{"complete":{"id":1}}`,
/// `{"flagOverdue":{"id":1}}` (the timer's), `{"notified":{"id":1,"receipt":"…"}}` (the notification's result).
public enum Reminders: Domain {
    /// One reminder.
    public struct Reminder: Codable, Equatable, Sendable {
        /// Its id: 1 for the first added, then 2, 3…; never reused.
        public var id: Int
        /// What to remember: not empty, at most ``Reminders/maximumTextLength`` bytes of UTF-8.
        public var text: String
        /// When it is due, in milliseconds since 1970: the timer that flags it overdue fires then.
        public var dueMilliseconds: Int64
        /// Whether it was completed.
        public var done = false
        /// Whether its due time came before it was completed.
        public var overdue = false
        /// The notification service's receipt, once its completion was notified.
        public var receipt: String?

        /// A reminder of `text`, due at `dueMilliseconds`, not done.
        public init(id: Int, text: String, dueMilliseconds: Int64) {
            self.id = id
            self.text = text
            self.dueMilliseconds = dueMilliseconds
        }
    }

    /// The reminders, in the order they were added, and the id the next one gets.
    public struct State: Codable, Equatable, Sendable {
        /// The reminders, sorted by id.
        public var reminders: [Reminder] = []
        /// The id the next `add` gives its reminder.
        public var nextID = 1

        /// No reminders.
        public init() {}

        /// The reminder with `id`, if there is one.
        public func reminder(_ id: Int) -> Reminder? {
            guard id >= 1, id < nextID, let index = reminders.firstIndex(where: { $0.id == id }) else { return nil }
            return reminders[index]
        }
    }

    /// What can happen to the reminders.
    public enum Action: Codable, Equatable, Sendable {
        /// Adds a reminder, due at `dueMilliseconds` (a time the sender chose: a domain never reads the clock).
        case add(text: String, dueMilliseconds: Int64)
        /// Completes reminder `id`: its overdue timer is cancelled and its completion notified.
        case complete(id: Int)
        /// Reminder `id` is due: the timer set by its `add` dispatches this.
        case flagOverdue(id: Int)
        /// The notification of reminder `id`'s completion was sent; `receipt` is the service's.
        case notified(id: Int, receipt: String)
    }

    /// What the outside world must do.
    public enum Effect: Codable, Equatable, Sendable {
        /// Tell the notification service that reminder `id`, `text`, was completed.
        case notify(id: Int, text: String)
    }

    /// The store's name: `reminders`.
    public static let name = "reminders"
    /// The first version.
    public static let version: UInt32 = 1
    /// No reminders.
    public static var initialState: State { State() }
    /// The longest text a reminder may have, in bytes of UTF-8.
    public static let maximumTextLength = 200
    /// The due times a reminder may have: from 1970 to the end of 9999, in milliseconds.
    public static let dueRange: ClosedRange<Int64> = 0...253_402_300_799_999

    /// An empty or too long text, or an id that does not exist, is refused; so is completing a reminder twice.
    public static func validate(_ action: Action, in state: State) throws(Rejection) {
        switch action {
        case let .add(text, due):
            guard !text.isEmpty, text.utf8.count <= maximumTextLength else {
                throw Rejection(
                    code: "bad_text",
                    "reminders: a text must have 1 to \(maximumTextLength) bytes, this one has \(text.utf8.count)"
                )
            }
            guard dueRange.contains(due) else {
                throw Rejection(
                    code: "bad_due",
                    "reminders: dueMilliseconds must be 0 (1970) to \(dueRange.upperBound) (the end of 9999), "
                        + "got \(due)"
                )
            }
        case let .complete(id):
            guard let reminder = state.reminder(id) else { throw unknown(id, state) }
            guard !reminder.done else {
                throw Rejection(code: "already_done", "reminders: reminder \(id) is done already")
            }
        case let .flagOverdue(id), let .notified(id, _):
            guard state.reminder(id) != nil else { throw unknown(id, state) }
        }
    }

    private static func unknown(_ id: Int, _ state: State) -> Rejection {
        Rejection(code: "unknown_reminder", "reminders: there is no reminder \(id); ids run 1…\(state.nextID - 1)")
    }

    /// Adds, completes, flags or records a receipt.
    public static func reduce(into state: inout State, _ action: Action) {
        switch action {
        case let .add(text, due):
            state.reminders.append(Reminder(id: state.nextID, text: text, dueMilliseconds: due))
            state.nextID += 1
        case let .complete(id):
            update(id, in: &state) { $0.done = true }
        case let .flagOverdue(id):
            update(id, in: &state) { if !$0.done { $0.overdue = true } }
        case let .notified(id, receipt):
            update(id, in: &state) { $0.receipt = receipt }
        }
    }

    private static func update(_ id: Int, in state: inout State, _ change: (inout Reminder) -> Void) {
        guard let index = state.reminders.firstIndex(where: { $0.id == id }) else { return }
        change(&state.reminders[index])
    }

    /// `add` sets the overdue timer of the reminder it made (key `due-ID`); `complete` cancels it and notifies.
    public static func effects(of action: Action, in state: State) -> [DomainEffect<Reminders>] {
        switch action {
        case let .add(_, due):
            let id = state.nextID - 1
            return [.schedule(.flagOverdue(id: id), atMilliseconds: due, key: "due-\(id)")]
        case let .complete(id):
            let text = state.reminder(id)?.text ?? ""
            return [.cancel(key: "due-\(id)"), .run(.notify(id: id, text: text))]
        case .flagOverdue, .notified:
            return []
        }
    }
}

extension Reminders {
    /// The outside service `lockstepd` notifies of completed reminders: a directory with one file per notification,
    /// named by its idempotency key. Like a real service given an idempotency key, it takes a notification it already
    /// has without sending it again, and answers with the same receipt: the effect's runs are at least once, the
    /// notifications exactly once. It also keeps a file per request received (`received/`), to count the runs.
    public struct Notifications: Sendable {
        /// Where the notifications are kept.
        public let directory: String

        /// The service keeping its notifications in `directory` (made when missing).
        public init(directory: String) {
            self.directory = directory
        }

        /// Sends the notification of `effect` under idempotency `key` (its effect's id, e.g. `reminders/12/0`), unless
        /// one was sent under that key; the receipt.
        public func send(_ effect: Effect, key: String) throws -> String {
            guard case let .notify(id, text) = effect else { return "" }
            let receipt = "notified:\(key)"
            let name = key.map { $0.isLetter || $0.isNumber ? String($0) : "-" }.joined()
            let file = URL(fileURLWithPath: "\(directory)/\(name).json")
            let line = "{\"key\":\"\(key)\",\"id\":\(id),\"text\":\(Self.quoted(text)),\"receipt\":\"\(receipt)\"}\n"
            do {
                try FileManager.default.createDirectory(
                    atPath: "\(directory)/received",
                    withIntermediateDirectories: true
                )
                try Data(key.utf8).write(to: URL(fileURLWithPath: "\(directory)/received/\(name).\(UUID().uuidString)"))
                // Created only when missing: a second send under the key finds the first.
                try Data(line.utf8).write(to: file, options: .withoutOverwriting)
            } catch {
                // Sent before, under this key: the same receipt, nothing sent again.
                if FileManager.default.fileExists(atPath: file.path) { return receipt }
                throw NotificationError(
                    description: "the notification service at \(directory) cannot take notification \(key): "
                        + error.localizedDescription
                )
            }
            return receipt
        }

        /// Every notification sent, as its JSON line, sorted by file name.
        public func sent() throws -> [String] {
            guard FileManager.default.fileExists(atPath: directory) else { return [] }
            return try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".json") }
                .sorted().map { try String(contentsOfFile: "\(directory)/\($0)", encoding: .utf8) }
        }

        /// The idempotency key of every request received, sent again or not.
        public func received() throws -> [String] {
            let path = "\(directory)/received"
            guard FileManager.default.fileExists(atPath: path) else { return [] }
            return try FileManager.default.contentsOfDirectory(atPath: path).sorted().map {
                try String(contentsOfFile: "\(path)/\($0)", encoding: .utf8)
            }
        }

        /// Why a notification could not be sent.
        public struct NotificationError: Error, CustomStringConvertible {
            public var description: String
        }

        private static func quoted(_ text: String) -> String {
            let data = (try? JSONEncoder().encode(text)) ?? Data("\"\"".utf8)
            return String(decoding: data, as: UTF8.self)
        }
    }
}
