/// At most one log line per 10 s for each kind of line, and how many were left out in between:
/// the server's one log-rate limiter (the engine's refused connections, the lines Redis traffic
/// causes; docs/replicas.md, "What a replica trusts"): 20,000 garbage messages on a channel, or
/// a flood of refused connections, make two lines a minute, not 20,000.
///
/// Thread-safety: a value type; its owner keeps it behind a lock.
public struct LogRateLimiter: Sendable, Equatable {
    /// The time between two lines of one kind.
    public static let interval = Duration.seconds(10)

    private var last: [String: ContinuousClock.Instant] = [:]
    private var leftOut: [String: UInt64] = [:]

    /// A limiter that has let no line through yet.
    public init() {}

    /// Whether a line of kind `key` may be written at `now`: `nil` when not (it is counted as
    /// left out), else how many lines of that kind were left out since the last.
    public mutating func admit(_ key: String, at now: ContinuousClock.Instant) -> UInt64? {
        if let then = last[key], now - then < Self.interval {
            leftOut[key, default: 0] &+= 1
            return nil
        }
        last[key] = now
        return leftOut.removeValue(forKey: key) ?? 0
    }

    /// `line`, followed by how many of its kind were left out before it (when any were).
    public static func annotate(_ line: String, leftOut: UInt64) -> String {
        guard leftOut > 0 else { return line }
        let lines = leftOut == 1 ? "line" : "lines"
        let seconds = interval.components.seconds
        return "\(line) (\(leftOut) more \(lines) like it left out in the last \(seconds) s or more)"
    }
}
