import ForgePushTokenOwner
import ServerSupport
import Testing

@testable import RedisTokenStore

/// `RedisMetrics.series`: the families, kinds, help texts and samples the store exported before its
/// series became values, so that dashboards and alerts keep working (the HTTP layer writes them;
/// StoreSeriesTests checks its text).
@Suite("RedisMetrics series")
struct RedisMetricsTests {
    @Test("every series, sample for sample, with cumulative buckets")
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
        let series = metrics.series(up: true, masterChanges: 4, sentinel: true, master: "10.0.0.1:6379")
        let writes = [
            ("0.0005", 0), ("0.001", 2), ("0.0025", 2), ("0.005", 2), ("0.01", 2), ("0.025", 2), ("0.05", 2),
            ("0.1", 2), ("0.25", 2), ("0.5", 2), ("1.0", 2), ("2.5", 2), ("+Inf", 3),
        ].map { "forge_push_token_redis_write_seconds_bucket{le=\"\($0.0)\"} \($0.1)\n" }.joined()
        let probes = [
            ("0.001", 1), ("0.0025", 1), ("0.005", 1), ("0.01", 1), ("0.025", 1), ("0.05", 1), ("0.1", 1),
            ("0.25", 1), ("0.5", 1), ("1.0", 1), ("2.0", 1), ("+Inf", 1),
        ].map { "forge_push_token_redis_probe_seconds_bucket{le=\"\($0.0)\"} \($0.1)\n" }.joined()
        let expected =
            "forge_push_token_redis_up 1\n" + "forge_push_token_redis_reconnects_total 1\n"
            + "forge_push_token_redis_errors_total 2\n" + writes
            + "forge_push_token_redis_write_seconds_sum 3.0014\nforge_push_token_redis_write_seconds_count 3\n"
            + probes + "forge_push_token_redis_probe_seconds_sum 0.001\nforge_push_token_redis_probe_seconds_count 1\n"
            + "forge_push_token_redis_master_changes_total 4\n"
            + RedisIgnoredMessage.allCases.map {
                "forge_push_token_redis_ignored_messages_total{kind=\"\($0.rawValue)\"} \($0 == .probe ? 1 : 0)\n"
            }.joined()
            + "forge_push_token_redis_master_info{address=\"10.0.0.1:6379\"} 1\n"
        #expect(sampleLines(series) == expected)
        #expect(
            series.map { "\($0.name) \($0.kind.rawValue): \($0.help)" } == [
                "forge_push_token_redis_up gauge: Whether the subscription to Redis is live and the state was read (1) or not (0).",
                "forge_push_token_redis_reconnects_total counter: Connections to Redis made again after one was lost.",
                "forge_push_token_redis_errors_total counter: Failed Redis connects, commands and timeouts.",
                "forge_push_token_redis_write_seconds histogram: Round trip of a token write through Redis.",
                "forge_push_token_redis_probe_seconds histogram: Round trip of a delivery probe, from publish to hearing it.",
                "forge_push_token_redis_master_changes_total counter: Times the Redis master's address changed.",
                "forge_push_token_redis_ignored_messages_total counter: Messages from Redis or a sentinel that changed nothing, by kind.",
                "forge_push_token_redis_master_info gauge: The Redis master in use, found through the sentinels.",
            ])
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
