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
    /// The round trip of each commit, from enqueue to reply.
    private(set) var writes = Histogram(
        bounds: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5])
    /// A delivery probe's round trip, from publish to hearing it.
    private(set) var probes = Histogram(bounds: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2])

    /// Subscriptions made again after one was lost.
    private(set) var reconnects: UInt64 = 0
    /// Failed connects, commands and timeouts.
    private(set) var errors: UInt64 = 0

    /// A subscription was made again.
    mutating func countReconnect() { reconnects &+= 1 }

    /// A connect, command or wait failed.
    mutating func countError() { errors &+= 1 }

    /// A commit was answered `seconds` after it was queued.
    mutating func recordWrite(seconds: Double) { writes.record(seconds) }

    /// A delivery probe came back after `seconds`.
    mutating func recordProbe(seconds: Double) { probes.record(seconds) }

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
        out += writes.render(
            "forge_push_token_redis_write_seconds", help: "Round trip of a token write through Redis.")
        out += probes.render(
            "forge_push_token_redis_probe_seconds", help: "Round trip of a delivery probe, from publish to hearing it.")
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

/// A Prometheus histogram of seconds: cumulative counts per upper bound, the count and the sum.
///
/// Thread-safety: a value type; its owner keeps it behind a lock.
struct Histogram: Sendable, Equatable {
    /// Upper bounds of the buckets, in seconds, ascending.
    let bounds: [Double]
    /// Observations per bucket, cumulative (an observation counts in every bucket whose bound it
    /// is within).
    private(set) var buckets: [UInt64]
    /// Observations.
    private(set) var count: UInt64 = 0
    /// Their sum, in seconds.
    private(set) var sum = 0.0

    /// An empty histogram with `bounds`.
    init(bounds: [Double]) {
        self.bounds = bounds
        buckets = [UInt64](repeating: 0, count: bounds.count)
    }

    /// Counts an observation of `seconds`.
    mutating func record(_ seconds: Double) {
        for (index, bound) in bounds.enumerated() where seconds <= bound {
            buckets[index] &+= 1
        }
        count &+= 1
        sum += seconds
    }

    /// The family `name` in the text format: HELP, TYPE, every bucket, `+Inf`, sum and count.
    func render(_ name: String, help: String) -> String {
        var out = "# HELP \(name) \(help)\n# TYPE \(name) histogram\n"
        for (index, bound) in bounds.enumerated() {
            out += "\(name)_bucket{le=\"\(bound)\"} \(buckets[index])\n"
        }
        out += "\(name)_bucket{le=\"+Inf\"} \(count)\n\(name)_sum \(sum)\n\(name)_count \(count)\n"
        return out
    }
}
