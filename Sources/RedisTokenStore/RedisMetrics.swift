import ForgePushTokenOwner
import ServerSupport

/// The store's counters, and their series for `/metrics` as values (`StoreMetric`, which the HTTP
/// layer renders as Prometheus text; docs/operations.md lists the series): the gauge `forge_push_token_redis_up` (0 or 1), the
/// counters `forge_push_token_redis_reconnects_total` and `forge_push_token_redis_errors_total`,
/// the histogram `forge_push_token_redis_write_seconds` (the round trip of each commit, from
/// enqueue to reply), the histogram `forge_push_token_redis_probe_seconds` (a delivery probe's
/// round trip), the counter `forge_push_token_redis_master_changes_total`, the counter
/// `forge_push_token_redis_ignored_messages_total{kind}` (`RedisIgnoredMessage`) and, with a
/// sentinel URL, the info gauge `forge_push_token_redis_master_info{address="HOST:PORT"}`.
/// It also keeps `limiter`, which decides which of the log lines Redis traffic causes are written.
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
    /// Messages from Redis or a sentinel that changed nothing, by kind.
    private(set) var ignored: [RedisIgnoredMessage: UInt64] = [:]
    /// Which log lines caused by Redis traffic are written.
    var limiter = LogRateLimiter()

    /// A message of `kind` changed nothing: counts it.
    mutating func countIgnored(_ kind: RedisIgnoredMessage) { ignored[kind, default: 0] &+= 1 }

    /// A subscription was made again.
    mutating func countReconnect() { reconnects &+= 1 }

    /// A connect, command or wait failed.
    mutating func countError() { errors &+= 1 }

    /// A commit was answered `seconds` after it was queued.
    mutating func recordWrite(seconds: Double) { writes.record(seconds) }

    /// A delivery probe came back after `seconds`.
    mutating func recordProbe(seconds: Double) { probes.record(seconds) }

    /// Every series, as values (`StoreMetric`, rendered by the HTTP layer); `up` is whether the
    /// link is connected, `masterChanges` how often the master's address changed, and with a
    /// sentinel URL (`sentinel`) `master` the master in use (`HOST:PORT`, never a password).
    func series(up: Bool, masterChanges: UInt64 = 0, sentinel: Bool = false, master: String? = nil) -> [StoreMetric] {
        var series: [StoreMetric] = [
            .single(
                "forge_push_token_redis_up", .gauge,
                help: "Whether the subscription to Redis is live and the state was read (1) or not (0).",
                .count(up ? 1 : 0)),
            .single(
                "forge_push_token_redis_reconnects_total", .counter,
                help: "Connections to Redis made again after one was lost.", .count(reconnects)),
            .single(
                "forge_push_token_redis_errors_total", .counter, help: "Failed Redis connects, commands and timeouts.",
                .count(errors)),
            Self.family(
                "forge_push_token_redis_write_seconds", help: "Round trip of a token write through Redis.", writes),
            Self.family(
                "forge_push_token_redis_probe_seconds",
                help: "Round trip of a delivery probe, from publish to hearing it.", probes),
            .single(
                "forge_push_token_redis_master_changes_total", .counter,
                help: "Times the Redis master's address changed.",
                .count(masterChanges)),
            StoreMetric(
                "forge_push_token_redis_ignored_messages_total", .counter,
                help: "Messages from Redis or a sentinel that changed nothing, by kind.",
                samples: RedisIgnoredMessage.allCases.map { kind in
                    StoreMetric.Sample(labels: [StoreMetric.Label("kind", kind.rawValue)], .count(ignored[kind] ?? 0))
                }),
        ]
        if sentinel {
            series.append(
                StoreMetric(
                    "forge_push_token_redis_master_info", .gauge,
                    help: "The Redis master in use, found through the sentinels.",
                    samples: master.map { [StoreMetric.Sample(labels: [StoreMetric.Label("address", $0)], .count(1))] }
                        ?? []))
        }
        return series
    }

    /// `histogram` as the family `name`.
    private static func family(_ name: String, help: String, _ histogram: Histogram) -> StoreMetric {
        .histogram(
            name, help: help, bounds: histogram.bounds, buckets: histogram.buckets, sum: histogram.sum,
            count: histogram.count)
    }
}

/// A kind of message from Redis (or a sentinel) that a replica does not act on, the `kind` label
/// of `forge_push_token_redis_ignored_messages_total` (docs/replicas.md, "What a replica
/// trusts"). Anyone allowed to publish on the channels can send them, so each is counted and its
/// log line limited (`LogRateLimiter`).
///
/// Thread-safety: a value type, `Sendable`.
enum RedisIgnoredMessage: String, Sendable, CaseIterable, Hashable {
    /// A message on `PREFIX:changes` that is not what the scripts publish.
    case malformed
    /// A change message whose state the read of `PREFIX:state` that followed did not hold.
    case unconfirmed
    /// A message on `PREFIX:probe` that is not a probe (`WRITER:SEQUENCE`).
    case probe
    /// A reply or subscription message over the bounds of `RedisReplyLimits`.
    case oversized
    /// A `+switch-master` for another master name, or not of its documented shape.
    case switchMaster = "switch_master"
    /// A `+switch-master` naming an address that no majority of the sentinels vouches for.
    case unvouched
}
