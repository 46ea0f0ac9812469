import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// The metrics count per thread (issue 32, "writes that do not stall on a preempted lock"):
/// each thread counts in a shard of its own, and what is rendered is the sum of the shards.
@Suite("Per-thread counting")
struct PerThreadCountingTests {
    /// The value of the sample `series` (name and labels, as rendered) in `text`, or `nil`.
    static func value(_ series: String, in text: String) -> Double? { OperatorSeriesTests.value(series, in: text) }

    @Test("a thread keeps its shard: what it adds there, it finds there")
    func threadKeepsItsShard() {
        let counts = PerThreadLocked(shards: 4) { 0 }
        // On one thread: every add lands in the same shard, so one shard holds them all.
        for _ in 0..<100 { counts.withThreadLock { $0 += 1 } }
        #expect(counts.withThreadLock { $0 } == 100)
        var shards: [Int] = []
        counts.forEachShard { shards.append($0) }
        #expect(shards.count == 4)
        #expect(shards.sorted() == [0, 0, 0, 100])
    }

    @Test("threads take different shards, and the shards add up to every count")
    func threadsTakeDifferentShards() {
        let counts = PerThreadLocked(shards: 64) { 0 }
        let threads = 8
        let each = 10_000
        // Threads of their own (a thread pool may run every item on one thread), each numbered
        // once on its first count: eight numbers, so at least two shards (all eight would share
        // one only if their numbers were 64 apart, hundreds of other threads numbered between).
        let done = DispatchGroup()
        for _ in 0..<threads {
            done.enter()
            Thread {
                for _ in 0..<each { counts.withThreadLock { $0 += 1 } }
                done.leave()
            }.start()
        }
        done.wait()
        var total = 0
        var used = 0
        counts.forEachShard { count in
            total += count
            if count > 0 { used += 1 }
        }
        #expect(total == threads * each)
        #expect(used >= 2)
    }

    @Test("histograms of several shards add up bucket by bucket")
    func histogramsAdd() {
        // Sums of powers of two, exact in a Double.
        var a = Histogram(bounds: [0.25, 1])
        var b = Histogram(bounds: [0.25, 1])
        a.record(0.125)
        a.record(2)
        b.record(0.5)
        b.record(0.25)
        a.add(b)
        #expect(a.buckets == [2, 1])
        #expect(a.count == 4)
        #expect(a.sum == 2.875)
    }

    @Test("requests counted on many threads are all rendered, counters and histograms")
    func metricsFromManyThreads() throws {
        let metrics = ServiceMetrics()
        let threads = 8
        let each = 500
        DispatchQueue.concurrentPerform(iterations: threads) { _ in
            for _ in 0..<each {
                metrics.increment(.registrationsAccepted)
                metrics.recordRequest(route: .register, method: "POST", status: 200, seconds: 0.0002)
                metrics.recordStreamEnded(.drain)
            }
        }
        let text = metrics.render(subscribers: 0, events: .init(sent: 0, skipped: 0))
        let total = Double(threads * each)
        #expect(Self.value("forge_push_token_registrations_accepted_total", in: text) == total)
        #expect(
            Self.value(
                #"forge_push_token_http_requests_total{route="/register",method="POST",status="200"}"#, in: text)
                == total)
        #expect(
            Self.value(#"forge_push_token_http_request_duration_seconds_count{route="/register"}"#, in: text) == total)
        #expect(
            Self.value(
                #"forge_push_token_http_request_duration_seconds_bucket{route="/register",le="0.00025"}"#, in: text)
                == total)
        #expect(
            Self.value(
                #"forge_push_token_http_request_duration_seconds_bucket{route="/register",le="0.0001"}"#, in: text) == 0
        )
        #expect(Self.value(#"forge_push_token_streams_ended_total{reason="drain"}"#, in: text) == total)
    }
}
