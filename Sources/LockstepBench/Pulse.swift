import Foundation
import Lockstep

/// The bench's domain with effects: each `ping` sets one `pong` going, which a no-op handler runs. What it measures is
/// the daemon's effect machinery alone: from the commit to the handler's start, and effects run per second.
package enum Pulse: Domain {
    package struct State: Codable, Equatable, Sendable {
        package var pings = 0
    }
    package enum Action: Codable, Equatable, Sendable { case ping }
    package enum Effect: Codable, Equatable, Sendable { case pong }

    package static let name = "pulse"
    package static let version: UInt32 = 1
    package static var initialState: State { State() }

    package static func reduce(into state: inout State, _ action: Action) { state.pings += 1 }

    package static func effects(of action: Action, in state: State) -> [DomainEffect<Pulse>] { [.run(.pong)] }

    /// `{"ping":{}}`, as the bench's clients send it.
    package static let ping = Array(#"{"ping":{}}"#.utf8)
}
