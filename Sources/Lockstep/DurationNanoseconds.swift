extension Duration {
    /// The whole nanoseconds of this duration (attoseconds below a nanosecond dropped): what a metric, a clock
    /// setting or a report in nanoseconds takes.
    package var nanoseconds: Int64 {
        components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000
    }
}
