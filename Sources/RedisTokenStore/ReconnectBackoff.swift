/// The delays between reconnect attempts: about 100 ms, doubling, to at most 1 s, each with
/// jitter ("equal jitter": a random point in the upper half of the step), so that the replicas of
/// one Redis do not all reconnect in the same instant (docs/replicas.md, "When something fails").
///
/// Thread-safety: a value type; each thread keeps its own.
public struct ReconnectBackoff: Sendable {
    /// The first step, in seconds.
    public let initial: Double
    /// The largest step, in seconds.
    public let maximum: Double
    private var step: Double

    /// Creates a schedule starting at `initial` seconds, doubling up to `maximum`.
    public init(initial: Double = 0.1, maximum: Double = 1.0) {
        self.initial = initial
        self.maximum = maximum
        self.step = initial
    }

    /// The next delay in seconds, in `step/2 ... step`, the point chosen by `random` (given the
    /// range, it returns a value in it; `Double.random(in:)` in production).
    public mutating func next(random: (ClosedRange<Double>) -> Double = { Double.random(in: $0) }) -> Double {
        let current = step
        step = min(step * 2, maximum)
        return random(current / 2...current)
    }

    /// Starts over from `initial` (after a successful connection).
    public mutating func reset() {
        step = initial
    }
}
