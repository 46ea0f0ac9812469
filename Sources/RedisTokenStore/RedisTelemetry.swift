import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

/// The Redis store's counters and histograms (`RedisMetrics`) and its log, with the limiter that
/// keeps lines Redis traffic causes to one per 10 s per kind (`LogRateLimiter`). Split out of
/// `RedisLink`, which drives the link's health.
///
/// Thread-safety: all members may be called from any thread. Its one lock (over `RedisMetrics`,
/// the limiter included) is a leaf, never held while logging.
final class RedisTelemetry: Sendable {
    private let metrics = Locked(RedisMetrics())
    private let logger: @Sendable (ServerLogLevel, String) -> Void

    /// Telemetry logging through `log`.
    init(log: @escaping @Sendable (ServerLogLevel, String) -> Void) {
        self.logger = log
    }

    /// Counts a failed connect, command or wait.
    func countError() { metrics.withLock { $0.countError() } }

    /// Counts a subscription made again.
    func countReconnect() { metrics.withLock { $0.countReconnect() } }

    /// Records a commit's round trip.
    func recordWrite(seconds: Double) { metrics.withLock { $0.recordWrite(seconds: seconds) } }

    /// Records a delivery probe's round trip.
    func recordProbe(seconds: Double) { metrics.withLock { $0.recordProbe(seconds: seconds) } }

    /// The series (`RedisMetrics.series`): `up` when the link is connected, and with a sentinel
    /// URL the master in use from `directory`.
    func series(up: Bool, directory: RedisSentinelDirectory?) -> [StoreMetric] {
        let master = directory?.master
        return metrics.withLock { $0 }.series(
            up: up, masterChanges: master?.changes ?? 0, sentinel: directory != nil,
            master: master?.host?.description)
    }

    /// Writes a log line.
    func log(_ level: ServerLogLevel, _ line: String) { logger(level, line) }

    /// A message of `kind` from Redis or a sentinel changed nothing: counts it, and logs `detail`
    /// as a warning at most once per 10 s per kind (`LogRateLimiter`).
    func ignored(_ kind: RedisIgnoredMessage, _ detail: String) {
        let leftOut = metrics.withLock { metrics -> UInt64? in
            metrics.countIgnored(kind)
            return metrics.limiter.admit("ignored." + kind.rawValue, at: .now)
        }
        if let leftOut { logger(.warning, LogRateLimiter.annotate(detail, leftOut: leftOut)) }
    }

    /// Logs `line` at most once per 10 s for `key` (a line that Redis traffic causes, such as a
    /// `+switch-master`), with how many were left out.
    func logLimited(_ key: String, _ level: ServerLogLevel, _ line: String) {
        let leftOut = metrics.withLock { $0.limiter.admit(key, at: .now) }
        if let leftOut { logger(level, LogRateLimiter.annotate(line, leftOut: leftOut)) }
    }
}
