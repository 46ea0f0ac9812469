import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import ServerSupport
import Testing

@testable import RedisTokenStore

/// One `redis-server --sentinel` on a free loopback port, with a configuration file of its own in
/// a temporary folder (a sentinel rewrites it, and exits without a writable one), monitoring
/// `master` on 127.0.0.1 `masterPort` with quorum 1; stopped by its pid.
final class SentinelProcess {
    let port: Int
    let pid: pid_t
    let folder: String

    init(master: String = "mymaster", masterPort: Int, password: String? = nil) throws {
        let folder = NSTemporaryDirectory() + "fpt-sentinel-" + String(UInt64.random(in: 0...UInt64.max), radix: 16)
        self.folder = folder
        try FileManager.default.createDirectory(atPath: folder, withIntermediateDirectories: true)
        let path = folder + "/sentinel.conf"
        (pid, port) = try startRedisServer(
            "redis-server --sentinel",
            arguments: { port in
                var config = """
                    port \(port)
                    bind 127.0.0.1
                    dir \(folder)
                    sentinel monitor \(master) 127.0.0.1 \(masterPort) 1
                    sentinel down-after-milliseconds \(master) 1000

                    """
                if let password { config += "requirepass \(password)\n" }
                try config.write(toFile: path, atomically: true, encoding: .utf8)
                return [path, "--sentinel"]
            },
            isReady: { port in
                do throws(RedisConnectionError) {
                    _ = try RedisConnection(
                        endpoint: RedisEndpoint(address: .tcp(host: "127.0.0.1", port: port)), timeout: 1,
                        select: false)
                    return true
                } catch {
                    if case .authFailed = error { return true }
                    return false
                }
            })
    }

    deinit {
        kill(pid, SIGKILL)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
        try? FileManager.default.removeItem(atPath: folder)
    }
}

/// Redis Sentinel (docs/replicas.md, "Redis Sentinel"): the master found through the sentinels
/// and checked with `ROLE`, and bad input. A failover (a master killed under writes, the
/// sentinels' `+switch-master` moving both connections; a sentinel accepts no PUBLISH of it) is
/// e2e/sentinel_test.py.
@Suite(.serialized) struct LiveSentinelTests {
    @Test func theMasterIsFoundThroughTheSentinels() throws {
        let master = try RedisServerProcess()
        let sentinel = try SentinelProcess(masterPort: master.port)
        let other = try SentinelProcess(masterPort: master.port)
        let dead = try freeLoopbackPort()
        let log = LogRecorder()
        // A sentinel that does not answer comes first: the two others are a majority of three.
        let replica = ReplicaModel(
            port: 0,
            url: "redis+sentinel://127.0.0.1:\(dead),127.0.0.1:\(sentinel.port),127.0.0.1:\(other.port)/mymaster",
            log: log.serverHandler)
        waitUntil(#"replica.link == "connected""#) { replica.link == "connected" }
        #expect(replica.commit("aa01") == .applied(TokenState(version: 1, token: "aa01")))
        #expect(try hash(master.client(), "test:state") == ["version": "1", "token": "aa01"])
        let metrics = replica.store.metricsText()
        #expect(metrics.contains("forge_push_token_redis_master_info{address=\"127.0.0.1:\(master.port)\"} 1\n"))
        #expect(metrics.contains("forge_push_token_redis_master_changes_total 0\n"))
        #expect(log.recorded.contains { $0.message.hasPrefix("Redis connected at redis+sentinel://127.0.0.1:") })

    }

    @Test func badInputGivesAClearReason() throws {
        let master = try RedisServerProcess()
        let replicaOfMaster = try RedisServerProcess(extra: ["--replicaof", "127.0.0.1", String(master.port)])
        let guarded = try SentinelProcess(masterPort: master.port, password: "right")
        let naming = try SentinelProcess(masterPort: replicaOfMaster.port)
        let cases: [(url: String, reason: String, says: String)] = [
            // Without the sentinels' password (a wrong one: below).
            ("redis+sentinel://127.0.0.1:\(guarded.port)/mymaster", "auth_failed", "refused the sentinel password"),
            ("redis+sentinel://127.0.0.1:\(naming.port)/unknown", "no_master", "knows no master named unknown"),
            (
                "redis+sentinel://127.0.0.1:\(try freeLoopbackPort())/mymaster", "sentinels_unreachable",
                "no sentinel answered"
            ),
            ("redis+sentinel://127.0.0.1:\(naming.port)/mymaster", "no_master", "not a master"),
        ]
        for item in cases {
            let log = LogRecorder()
            let replica = ReplicaModel(port: 0, url: item.url, log: log.serverHandler)
            // The link's health is set under its lock, its line logged just after the lock is
            // released: wait for both (as LiveTLSTests does).
            waitUntil(
                "\(item.url): link \(item.reason) and a line saying \(item.says) (now \(replica.link), \(log.recorded.map(\.message)))"
            ) { replica.link == item.reason && log.recorded.contains { $0.message.contains(item.says) } }
            #expect(replica.commit("aa") == .unavailable(reason: "Redis: \(item.reason)"))
        }
        var wrong = RedisTokenStore.Configuration(
            endpoint: try RedisEndpoint.parse("redis+sentinel://127.0.0.1:\(guarded.port)/mymaster"),
            prefix: RedisKeyPrefix("test")!)
        wrong.endpoint.sentinel?.password = Array("wrong".utf8)
        let log = LogRecorder()
        let store = RedisTokenStore(configuration: wrong, log: log.serverHandler)
        store.start(reporting: { _ in })
        defer { store.stop() }
        waitUntil(#"store.linkHealth == "auth_failed""#) { store.linkHealth == "auth_failed" }
        #expect(!log.recorded.contains { $0.message.contains("wrong") })
        var right = wrong
        right.endpoint.sentinel?.password = Array("right".utf8)
        let fixed = RedisTokenStore(configuration: right, log: { _, _ in })
        fixed.start(reporting: { _ in })
        defer { fixed.stop() }
        waitUntil(#"fixed.linkHealth == "connected""#) { fixed.linkHealth == "connected" }
    }
}
