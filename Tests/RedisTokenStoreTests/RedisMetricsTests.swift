import ServerSupport
import Testing

@testable import RedisTokenStore

/// `RedisMetrics.render` through the shared writer (`PrometheusText`, `Histogram`): the exact text
/// the store exported before the writer was shared, so that dashboards and alerts keep working.
@Suite("RedisMetrics text")
struct RedisMetricsTests {
    @Test("every series, byte for byte, with cumulative buckets")
    func exactText() {
        var metrics = RedisMetrics()
        metrics.recordWrite(seconds: 0.0007)
        metrics.recordWrite(seconds: 0.0007)
        metrics.recordWrite(seconds: 3)
        metrics.recordProbe(seconds: 0.001)
        metrics.countReconnect()
        metrics.countError()
        metrics.countError()
        metrics.countIgnored(.probe)
        let text = metrics.render(up: true, masterChanges: 4, sentinel: true, master: "10.0.0.1:6379")
        let writes = [
            ("0.0005", 0), ("0.001", 2), ("0.0025", 2), ("0.005", 2), ("0.01", 2), ("0.025", 2), ("0.05", 2),
            ("0.1", 2), ("0.25", 2), ("0.5", 2), ("1.0", 2), ("2.5", 2), ("+Inf", 3),
        ].map { "forge_push_token_redis_write_seconds_bucket{le=\"\($0.0)\"} \($0.1)\n" }.joined()
        let probes = [
            ("0.001", 1), ("0.0025", 1), ("0.005", 1), ("0.01", 1), ("0.025", 1), ("0.05", 1), ("0.1", 1),
            ("0.25", 1), ("0.5", 1), ("1.0", 1), ("2.0", 1), ("+Inf", 1),
        ].map { "forge_push_token_redis_probe_seconds_bucket{le=\"\($0.0)\"} \($0.1)\n" }.joined()
        let expected =
            "# HELP forge_push_token_redis_up Whether the subscription to Redis is live and the state was read (1) or not (0).\n"
            + "# TYPE forge_push_token_redis_up gauge\nforge_push_token_redis_up 1\n"
            + "# HELP forge_push_token_redis_reconnects_total Connections to Redis made again after one was lost.\n"
            + "# TYPE forge_push_token_redis_reconnects_total counter\nforge_push_token_redis_reconnects_total 1\n"
            + "# HELP forge_push_token_redis_errors_total Failed Redis connects, commands and timeouts.\n"
            + "# TYPE forge_push_token_redis_errors_total counter\nforge_push_token_redis_errors_total 2\n"
            + "# HELP forge_push_token_redis_write_seconds Round trip of a token write through Redis.\n"
            + "# TYPE forge_push_token_redis_write_seconds histogram\n" + writes
            + "forge_push_token_redis_write_seconds_sum 3.0014\nforge_push_token_redis_write_seconds_count 3\n"
            + "# HELP forge_push_token_redis_probe_seconds Round trip of a delivery probe, from publish to hearing it.\n"
            + "# TYPE forge_push_token_redis_probe_seconds histogram\n" + probes
            + "forge_push_token_redis_probe_seconds_sum 0.001\nforge_push_token_redis_probe_seconds_count 1\n"
            + "# HELP forge_push_token_redis_master_changes_total Times the Redis master's address changed.\n"
            + "# TYPE forge_push_token_redis_master_changes_total counter\n"
            + "forge_push_token_redis_master_changes_total 4\n"
            + "# HELP forge_push_token_redis_ignored_messages_total Messages from Redis or a sentinel that changed nothing, by kind.\n"
            + "# TYPE forge_push_token_redis_ignored_messages_total counter\n"
            + RedisIgnoredMessage.allCases.map {
                "forge_push_token_redis_ignored_messages_total{kind=\"\($0.rawValue)\"} \($0 == .probe ? 1 : 0)\n"
            }.joined()
            + "# HELP forge_push_token_redis_master_info The Redis master in use, found through the sentinels.\n"
            + "# TYPE forge_push_token_redis_master_info gauge\n"
            + "forge_push_token_redis_master_info{address=\"10.0.0.1:6379\"} 1\n"
        #expect(text == expected)
    }

    @Test("a histogram counts an observation on a bound in that bound's bucket, above the last in +Inf only")
    func histogramBounds() {
        var histogram = Histogram(bounds: [0.5, 1])
        for seconds in [0.5, 0.75, 1, 1.5] { histogram.record(seconds) }
        #expect(histogram.buckets == [1, 2])
        #expect(histogram.count == 4)
        #expect(histogram.sum == 3.75)
        var text = PrometheusText()
        text.histogram("h", labels: #"route="/x""#, histogram)
        #expect(
            text.text
                == "h_bucket{route=\"/x\",le=\"0.5\"} 1\nh_bucket{route=\"/x\",le=\"1.0\"} 3\n"
                + "h_bucket{route=\"/x\",le=\"+Inf\"} 4\nh_sum{route=\"/x\"} 3.75\nh_count{route=\"/x\"} 4\n")
        #expect(PrometheusText.escapeLabel("a\\b\"c\nd") == #"a\\b\"c\nd"#)
    }
}
