import Foundation

extension Board {
    /// The outside service boardd tells of cards moved into the done column, standing in for a mail or chat
    /// service: a directory with one file per notification, named by its idempotency key.
    ///
    /// The daemon runs an effect at least once (a daemon killed after a run and before its result was journaled
    /// runs it again), so the handler hands the effect's id to the service as its idempotency key, as it would to a
    /// real service: a notification already sent under that key is not sent again, and the answer is the same
    /// receipt. So each notification is sent once, however many times its effect runs.
    public struct Notifications: Sendable {
        /// What one notification file holds, as one line of JSON.
        public struct Notification: Codable, Equatable, Sendable {
            /// The idempotency key it was sent under: its effect's id, `board/SEQ/INDEX`.
            public var key: String
            /// The card moved into done.
            public var card: Int
            /// Its title then.
            public var title: String

            public init(key: String, card: Int, title: String) {
                self.key = key
                self.card = card
                self.title = title
            }
        }

        /// Why a notification could not be sent: the handler throws it, and the daemon tries the effect again
        /// after a backoff (a dead letter after its tries, which `board effects` lists).
        public struct Failure: Error, CustomStringConvertible {
            public var description: String
        }

        /// Where the notifications are kept.
        public let directory: String

        /// The service keeping its notifications in `directory` (made when missing).
        public init(directory: String) {
            self.directory = directory
        }

        /// Sends the notification of `effect` under idempotency `key`, unless one was sent under that key
        /// already; the service's receipt, the same either way.
        public func send(_ effect: Effect, key: String) throws -> String {
            guard case let .notify(card, title) = effect else { return "" }
            let receipt = "notified:\(key)"
            let file = "\(directory)/\(Self.fileName(key))"
            if FileManager.default.fileExists(atPath: file) { return receipt }
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
                var line = try encoder.encode(Notification(key: key, card: card, title: title))
                line.append(UInt8(ascii: "\n"))
                // Written whole under a name of its own, then linked to the key's name, which fails when a file
                // has it: a notification appears whole or not at all, and once.
                let partial = "\(directory)/.\(UUID().uuidString).partial"
                try line.write(to: URL(fileURLWithPath: partial))
                defer { try? FileManager.default.removeItem(atPath: partial) }
                try FileManager.default.linkItem(atPath: partial, toPath: file)
            } catch {
                // Another run of the same effect got there first: sent once, the same receipt.
                if FileManager.default.fileExists(atPath: file) { return receipt }
                throw Failure(
                    description: "the notification service at \(directory) cannot take notification \(key): "
                        + error.localizedDescription
                )
            }
            return receipt
        }

        /// Every notification sent, sorted by file name.
        public func sent() throws -> [Notification] {
            guard FileManager.default.fileExists(atPath: directory) else { return [] }
            return try FileManager.default.contentsOfDirectory(atPath: directory)
                .filter { $0.hasSuffix(".json") }
                .sorted()
                .map {
                    try JSONDecoder().decode(
                        Notification.self,
                        from: Data(contentsOf: URL(fileURLWithPath: "\(directory)/\($0)"))
                    )
                }
        }

        /// The file of the notification sent under `key`: `board/12/1` is `board-12-1.json`.
        public static func fileName(_ key: String) -> String {
            key.map { $0.isLetter || $0.isNumber ? String($0) : "-" }.joined() + ".json"
        }
    }
}
