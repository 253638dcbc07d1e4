/// A small, fast random number generator whose sequence depends only on its seed: the same seed gives the
/// same numbers in every process and on every platform.
///
/// For generating actions in tests, demos and the replay harness — never inside a reducer, which must not
/// draw random numbers at all.
public struct SplitMix64: RandomNumberGenerator, Sendable {
    private var state: UInt64

    /// A generator whose numbers are fixed by `seed`: a replay or a demo run again with the same seed draws the same
    /// actions.
    public init(seed: UInt64) {
        state = seed
    }

    /// The next 64 random bits (the SplitMix64 step: a Weyl increment, then two xor-shift-multiply rounds).
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// A domain that can invent plausible actions for a state, for demos, benchmarks and the replay harness.
///
/// Most generated actions should pass validation; a few that do not exercise the rejection path.
public protocol ActionGenerating: Domain {
    /// An action to try on `state`, drawn from `random`.
    static func randomAction(for state: State, using random: inout SplitMix64) -> Action
}

extension ActionGenerating {
    /// The names of the action cases the generator makes along a random walk of `steps` actions from the initial
    /// state (each one valid applied), sorted: how an error names a domain's actions to a person who sent another.
    public static func generatedCaseNames(steps: Int = 500) -> [String] {
        var random = SplitMix64(seed: 1)
        var state = initialState
        var names = Set<String>()
        for _ in 0..<steps {
            let action = randomAction(for: state, using: &random)
            if let bytes = try? CanonicalEncoding.encode(action),
                case let .object(members)? = try? JSONValue(parsing: Array(bytes))
            {
                names.formUnion(members.keys)
            }
            if (try? validate(action, in: state, by: .unknown)) != nil { reduce(into: &state, action, by: .unknown) }
        }
        return names.sorted()
    }
}
