import ForgePushToken
import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import RedisTokenStore

/// A `redis-server` started for one test on a free loopback port (`--save '' --appendonly no`),
/// stopped by its pid.
final class RedisServerProcess {
    let port: Int
    /// The server's pid (spawned with posix_spawn: Foundation's Process leaks a weak reference per
    /// run, which LeakSanitizer reports).
    let pid: pid_t

    init(extra: [String] = []) throws {
        port = try freeLoopbackPort()
        let arguments =
            ["redis-server", "--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"] + extra
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        var argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }
        var spawned: pid_t = 0
        let result = posix_spawnp(&spawned, "redis-server", &actions, nil, &argv, environ)
        guard result == 0 else { throw CocoaError(.executableNotLoadable) }
        pid = spawned
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline {
            do {
                _ = try RedisConnection(endpoint: endpointWithoutAuth, timeout: 1)
                return
            } catch {
                // With --requirepass a refusal of the credentials also proves the server is up.
                if case .authFailed = error { return }
            }
            usleep(20_000)
        }
        throw CocoaError(.fileNoSuchFile)
    }

    var endpointWithoutAuth: RedisEndpoint { RedisEndpoint(address: .tcp(host: "127.0.0.1", port: port)) }

    /// A connection for inspecting the server from the test.
    func client(password: String? = nil) throws -> RedisConnection {
        var endpoint = endpointWithoutAuth
        endpoint.password = password.map { Array($0.utf8) }
        return try RedisConnection(endpoint: endpoint, timeout: 2)
    }

    deinit {
        kill(pid, SIGKILL)
        var status: Int32 = 0
        waitpid(pid, &status, 0)
    }
}

/// A minimal replica: keeps the newest state it was given, as the token owner does.
final class ReplicaModel: Sendable {
    let state = Locked<SharedTokenState?>(nil)
    let health = Locked<RedisTokenStore.Health>(.unreachable)
    let store: RedisTokenStore

    init(port: Int, password: String? = nil, user: String? = nil, prefix: String = "test", queueCapacity: Int = 4096) {
        var endpoint = RedisEndpoint(address: .tcp(host: "127.0.0.1", port: port))
        endpoint.password = password.map { Array($0.utf8) }
        endpoint.user = user
        var configuration = RedisTokenStore.Configuration(endpoint: endpoint, prefix: RedisKeyPrefix(prefix)!)
        configuration.checkInterval = 0.5
        configuration.queueCapacity = queueCapacity
        store = RedisTokenStore(configuration: configuration, log: { _, _ in })
        store.start(
            onState: { [state] new in
                state.withLock { current in
                    if current == nil || current!.version < new.version { current = new }
                }
            },
            onHealth: { [health] new, _ in health.withLock { $0 = new } })
    }

    var current: SharedTokenState? { state.withLock { $0 } }

    func commit(_ token: String?) -> RedisTokenStore.WriteOutcome {
        let result = Locked<RedisTokenStore.WriteOutcome?>(nil)
        let done = DispatchSemaphore(value: 0)
        store.commit(token: token) { outcome in
            result.withLock { $0 = outcome }
            done.signal()
        }
        done.wait()
        return result.withLock { $0 }!
    }

    /// Waits up to `seconds` for `condition`.
    func wait(seconds: Double = 5, until condition: () -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if condition() { return true }
            usleep(10_000)
        }
        return condition()
    }

    deinit { store.stop() }
}

func hash(_ connection: RedisConnection, _ key: String) throws -> [String: String] {
    guard case .array(let items) = try connection.command(["HGETALL", key], timeout: 2) else { return [:] }
    var fields: [String: String] = [:]
    var index = 0
    while index + 1 < items.count {
        fields[items[index].text ?? ""] = items[index + 1].text ?? ""
        index += 2
    }
    return fields
}

/// The connection, scripts and store against a real `redis-server`.
@Suite(.serialized) struct LiveRedisTests {
    @Test func replyDecoding() throws {
        let redis = try RedisServerProcess()
        let client = try redis.client()
        let binary: [UInt8] = [0, 1, 0xFF, 13, 10, 36]
        #expect(try client.command([Array("SET".utf8), Array("k".utf8), binary], timeout: 2) == .status("OK"))
        #expect(try client.command(["GET", "k"], timeout: 2) == .bulk(binary))
        #expect(try client.command(["GET", "missing"], timeout: 2) == .null)
        #expect(try client.command(["INCRBY", "n", "41"], timeout: 2) == .integer(41))
        #expect(
            try client.command(["EVAL", "return {1, 'a', {2, false}}", "0"], timeout: 2)
                == .array([.integer(1), .bulk(Array("a".utf8)), .array([.integer(2), .null])]))
        #expect(try client.command(["NOSUCHCOMMAND"], timeout: 2).errorCode == "ERR")
        // Pipelining: three commands, one flush, three replies in order.
        client.append(["PING"])
        client.append(["ECHO", "x"])
        client.append(["INCR", "n"])
        try client.flush()
        let deadline = monotonicSeconds() + 2
        #expect(try client.readReply(deadline: deadline) == .status("PONG"))
        #expect(try client.readReply(deadline: deadline) == .bulk(Array("x".utf8)))
        #expect(try client.readReply(deadline: deadline) == .integer(42))
        // Nothing more comes: the wait ends at the deadline.
        #expect(throws: RedisConnectionError.timedOut) { try client.readReply(deadline: monotonicSeconds() + 0.1) }
    }

    @Test func aHungRedisGivesUnknownInTwoSecondsAndAFullQueueRefusesAtOnce() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port, queueCapacity: 2)
        #expect(a.wait { a.health.withLock { $0 } == .connected })
        kill(redis.pid, SIGSTOP)
        defer { kill(redis.pid, SIGCONT) }
        let outcomes = Locked<[RedisTokenStore.WriteOutcome]>([])
        let done = DispatchSemaphore(value: 0)
        let started = monotonicSeconds()
        // The first batch blocks the writer on the hung Redis; 2 more fill the queue; the rest
        // are refused at once.
        for n in 0..<6 {
            a.store.commit(token: String(format: "%02x", n)) { outcome in
                outcomes.withLock { $0.append(outcome) }
                done.signal()
            }
            usleep(20_000)
        }
        let refusedAtOnce = outcomes.withLock { $0.filter { $0 == .unavailable(.unreachable) }.count }
        #expect(refusedAtOnce >= 2)
        for _ in 0..<6 { done.wait() }
        let elapsed = monotonicSeconds() - started
        #expect(outcomes.withLock { $0.contains(.unknown) })
        #expect(elapsed >= 1.9 && elapsed < 6)
        kill(redis.pid, SIGCONT)
        #expect(a.wait(seconds: 8) { a.health.withLock { $0 } == .connected })
        guard case .applied(let state, _) = a.commit("ff") else {
            Issue.record("no write after SIGCONT")
            return
        }
        #expect(state.token == "ff")
    }

    @Test func unixSocketAndDatabase() throws {
        let path = "/tmp/forge-push-token-redis-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).sock"
        defer { unlink(path) }
        let redis = try RedisServerProcess(extra: ["--unixsocket", path, "--unixsocketperm", "700"])
        let socket = try RedisConnection(endpoint: try RedisEndpoint.parse("unix://\(path)?db=3"), timeout: 2)
        #expect(try socket.command(["SET", "where", "db3"], timeout: 2) == .status("OK"))
        let tcp = try redis.client()
        #expect(try tcp.command(["GET", "where"], timeout: 2) == .null)
        #expect(try tcp.command(["SELECT", "3"], timeout: 2) == .status("OK"))
        #expect(try tcp.command(["GET", "where"], timeout: 2) == .bulk(Array("db3".utf8)))
    }

    @Test func changesReachEveryReplicaWithTheSameVersion() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port)
        let b = ReplicaModel(port: redis.port)
        #expect(a.wait { a.health.withLock { $0 } == .connected && b.health.withLock { $0 } == .connected })
        #expect(a.current == SharedTokenState(version: 0, token: nil))
        #expect(a.commit("aa01") == .applied(SharedTokenState(version: 1, token: "aa01"), changed: true))
        #expect(b.wait(seconds: 1) { b.current == SharedTokenState(version: 1, token: "aa01") })
        // The same token again through the other replica changes nothing.
        #expect(b.commit("aa01") == .applied(SharedTokenState(version: 1, token: "aa01"), changed: false))
        #expect(b.commit(nil) == .applied(SharedTokenState(version: 2, token: nil), changed: true))
        #expect(a.commit(nil) == .applied(SharedTokenState(version: 2, token: nil), changed: false))
        #expect(a.wait(seconds: 1) { a.current == SharedTokenState(version: 2, token: nil) })
        let client = try redis.client()
        #expect(try hash(client, "test:state") == ["version": "2"])
        // After SCRIPT FLUSH the writer falls back to EVAL.
        #expect(try client.command(["SCRIPT", "FLUSH"], timeout: 2) == .status("OK"))
        #expect(a.commit("bb") == .applied(SharedTokenState(version: 3, token: "bb"), changed: true))
        let metrics = a.store.renderMetrics()
        #expect(metrics.contains("forge_push_token_redis_up 1\n"))
        #expect(metrics.contains("forge_push_token_redis_write_seconds_count 3\n"))
    }

    @Test func dataLossIsWrittenBackAndTiesBumpTheVersion() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port)
        #expect(a.wait { a.health.withLock { $0 } == .connected })
        for token in ["01", "02", "03"] { _ = a.commit(token) }
        let client = try redis.client()
        #expect(try client.command(["FLUSHALL"], timeout: 2) == .status("OK"))
        // The periodic check finds the key missing and writes the replica's state back.
        #expect(a.wait { (try? hash(client, "test:state")) == ["version": "3", "token": "03"] })
        // Lower in Redis than in the replica: written back as well.
        _ = try client.command(["HSET", "test:state", "version", "1", "token", "01"], timeout: 2)
        #expect(a.wait { (try? hash(client, "test:state")) == ["version": "3", "token": "03"] })
        // Same version, another token: the stored token wins at the next version.
        _ = try client.command(["HSET", "test:state", "version", "3", "token", "ee"], timeout: 2)
        #expect(a.wait { a.current == SharedTokenState(version: 4, token: "ee") })
        #expect(try hash(client, "test:state") == ["version": "4", "token": "ee"])
        // A newer version set elsewhere is adopted, never overwritten.
        _ = try client.command(["HSET", "test:state", "version", "10", "token", "ff"], timeout: 2)
        #expect(a.wait { a.current == SharedTokenState(version: 10, token: "ff") })
        #expect(a.commit("ff") == .applied(SharedTokenState(version: 10, token: "ff"), changed: false))
    }

    @Test func invalidStateIsReportedAndNeverOverwritten() throws {
        let redis = try RedisServerProcess()
        let client = try redis.client()
        for (setup, expected) in [
            (["SET", "test:state", "garbage"], RedisReply.bulk(Array("garbage".utf8))),
            (["HSET", "test:state", "version", "x1"], .bulk(Array("x1".utf8))),
        ] {
            _ = try client.command(["DEL", "test:state"], timeout: 2)
            _ = try client.command(setup, timeout: 2)
            let a = ReplicaModel(port: redis.port)
            #expect(a.wait { a.health.withLock { $0 } == .invalidState })
            #expect(a.commit("ab") == .unavailable(.invalidState))
            let stored =
                setup[0] == "SET"
                ? try client.command(["GET", "test:state"], timeout: 2)
                : try client.command(["HGET", "test:state", "version"], timeout: 2)
            #expect(stored == expected)
            // Repaired by deleting the key: the replica recovers.
            _ = try client.command(["DEL", "test:state"], timeout: 2)
            #expect(a.wait { a.health.withLock { $0 } == .connected })
            #expect(a.commit("ab") == .applied(SharedTokenState(version: 1, token: "ab"), changed: true))
            _ = try client.command(["DEL", "test:state"], timeout: 2)
        }
    }

    @Test func wrongCredentialsAndNoServer() throws {
        let redis = try RedisServerProcess(extra: ["--requirepass", "right"])
        let wrong = ReplicaModel(port: redis.port, password: "wrong")
        #expect(wrong.wait { wrong.health.withLock { $0 } == .authFailed })
        #expect(wrong.commit("aa") == .unavailable(.authFailed))
        let missing = ReplicaModel(port: redis.port)
        #expect(missing.wait { missing.health.withLock { $0 } == .authFailed })
        let right = ReplicaModel(port: redis.port, password: "right")
        #expect(right.wait { right.health.withLock { $0 } == .connected })
        let wrongUser = ReplicaModel(port: redis.port, password: "right", user: "nobody")
        #expect(wrongUser.wait { wrongUser.health.withLock { $0 } == .authFailed })

        let nothing = ReplicaModel(port: try freeLoopbackPort())
        usleep(300_000)
        #expect(nothing.health.withLock { $0 } == .unreachable)
        #expect(nothing.commit("aa") == .unavailable(.unreachable))
        #expect(nothing.current == nil)
    }

    @Test func aWriteOnADeadIdleConnectionIsSentAgainOnANewOne() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port)
        #expect(a.wait { a.health.withLock { $0 } == .connected })
        #expect(a.commit("01") == .applied(SharedTokenState(version: 1, token: "01"), changed: true))
        // Kills the writer's idle connection (and not this client's: SKIPME yes is the default).
        let client = try redis.client()
        #expect(try client.command(["CLIENT", "KILL", "TYPE", "normal"], timeout: 2) != .null)
        #expect(a.commit("02") == .applied(SharedTokenState(version: 2, token: "02"), changed: true))
    }

    @Test func reconnectsAfterTheSubscriptionIsKilled() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port)
        let b = ReplicaModel(port: redis.port)
        #expect(a.wait { a.health.withLock { $0 } == .connected && b.health.withLock { $0 } == .connected })
        let client = try redis.client()
        _ = try client.command(["CLIENT", "KILL", "TYPE", "pubsub"], timeout: 2)
        _ = a.commit("cafe")
        #expect(b.wait { b.current == SharedTokenState(version: 1, token: "cafe") })
        #expect(b.wait { b.store.renderMetrics().contains("forge_push_token_redis_reconnects_total 1\n") })
    }
}
