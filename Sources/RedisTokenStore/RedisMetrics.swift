/// The store's counters, and their Prometheus text (version 0.0.4) for `/metrics`
/// (docs/operations.md lists the series): the gauge `forge_push_token_redis_up` (0 or 1), the
/// counters `forge_push_token_redis_reconnects_total` and `forge_push_token_redis_errors_total`,
/// the histogram `forge_push_token_redis_write_seconds` (the round trip of each commit, from
/// enqueue to reply), the histogram `forge_push_token_redis_probe_seconds` (a delivery probe's
/// round trip), the counter `forge_push_token_redis_master_changes_total` and, with a
/// sentinel URL, the info gauge `forge_push_token_redis_master_info{address="HOST:PORT"}`.
///
/// Thread-safety: a value type; `RedisLink` keeps it behind a lock.
struct RedisMetrics: Sendable, Equatable {
    /// Upper bounds, in seconds, of the `forge_push_token_redis_write_seconds` buckets.
    static let writeBuckets: [Double] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5]

    /// Upper bounds, in seconds, of the `forge_push_token_redis_probe_seconds` buckets.
    static let probeBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2]
    /// Probes per bucket (cumulative), their count and summed round trips.
    private(set) var probeBuckets = [UInt64](repeating: 0, count: RedisMetrics.probeBuckets.count)
    private(set) var probeCount: UInt64 = 0
    private(set) var probeSum = 0.0

    /// Subscriptions made again after one was lost.
    private(set) var reconnects: UInt64 = 0
    /// Failed connects, commands and timeouts.
    private(set) var errors: UInt64 = 0
    /// Commits per bucket (cumulative: a commit counts in every bucket whose bound it is within).
    private(set) var writeBuckets = [UInt64](repeating: 0, count: RedisMetrics.writeBuckets.count)
    /// Commits answered by Redis.
    private(set) var writeCount: UInt64 = 0
    /// Their round trips, summed, in seconds.
    private(set) var writeSum = 0.0

    /// A subscription was made again.
    mutating func countReconnect() { reconnects &+= 1 }

    /// A connect, command or wait failed.
    mutating func countError() { errors &+= 1 }

    /// A commit was answered `seconds` after it was queued.
    mutating func recordWrite(seconds: Double) {
        for (index, bound) in Self.writeBuckets.enumerated() where seconds <= bound {
            writeBuckets[index] &+= 1
        }
        writeCount &+= 1
        writeSum += seconds
    }

    /// A delivery probe came back after `seconds`.
    mutating func recordProbe(seconds: Double) {
        for (index, bound) in Self.probeBuckets.enumerated() where seconds <= bound {
            probeBuckets[index] &+= 1
        }
        probeCount &+= 1
        probeSum += seconds
    }

    /// The text of every series; `up` is whether the link is connected, `masterChanges` how often
    /// the master's address changed, and with a sentinel URL (`sentinel`) `master` the master in
    /// use (`HOST:PORT`, never a password).
    func render(up: Bool, masterChanges: UInt64 = 0, sentinel: Bool = false, master: String? = nil) -> String {
        var out = ""
        out +=
            "# HELP forge_push_token_redis_up Whether the subscription to Redis is live and the state was read (1) or not (0).\n"
        out += "# TYPE forge_push_token_redis_up gauge\n"
        out += "forge_push_token_redis_up \(up ? 1 : 0)\n"
        out += "# HELP forge_push_token_redis_reconnects_total Connections to Redis made again after one was lost.\n"
        out += "# TYPE forge_push_token_redis_reconnects_total counter\n"
        out += "forge_push_token_redis_reconnects_total \(reconnects)\n"
        out += "# HELP forge_push_token_redis_errors_total Failed Redis connects, commands and timeouts.\n"
        out += "# TYPE forge_push_token_redis_errors_total counter\n"
        out += "forge_push_token_redis_errors_total \(errors)\n"
        out += "# HELP forge_push_token_redis_write_seconds Round trip of a token write through Redis.\n"
        out += "# TYPE forge_push_token_redis_write_seconds histogram\n"
        for (index, bound) in Self.writeBuckets.enumerated() {
            out += "forge_push_token_redis_write_seconds_bucket{le=\"\(bound)\"} \(writeBuckets[index])\n"
        }
        out += "forge_push_token_redis_write_seconds_bucket{le=\"+Inf\"} \(writeCount)\n"
        out += "forge_push_token_redis_write_seconds_sum \(writeSum)\n"
        out += "forge_push_token_redis_write_seconds_count \(writeCount)\n"
        out +=
            "# HELP forge_push_token_redis_probe_seconds Round trip of a delivery probe, from publish to hearing it.\n"
        out += "# TYPE forge_push_token_redis_probe_seconds histogram\n"
        for (index, bound) in Self.probeBuckets.enumerated() {
            out += "forge_push_token_redis_probe_seconds_bucket{le=\"\(bound)\"} \(probeBuckets[index])\n"
        }
        out += "forge_push_token_redis_probe_seconds_bucket{le=\"+Inf\"} \(probeCount)\n"
        out += "forge_push_token_redis_probe_seconds_sum \(probeSum)\n"
        out += "forge_push_token_redis_probe_seconds_count \(probeCount)\n"
        out += "# HELP forge_push_token_redis_master_changes_total Times the Redis master's address changed.\n"
        out += "# TYPE forge_push_token_redis_master_changes_total counter\n"
        out += "forge_push_token_redis_master_changes_total \(masterChanges)\n"
        if sentinel {
            out += "# HELP forge_push_token_redis_master_info The Redis master in use, found through the sentinels.\n"
            out += "# TYPE forge_push_token_redis_master_info gauge\n"
            if let master {
                // A host name or IP address and a port (RedisSentinelDirectory refuses anything
                // else), so nothing needs escaping in the label.
                out += "forge_push_token_redis_master_info{address=\"\(master)\"} 1\n"
            }
        }
        return out
    }
}
