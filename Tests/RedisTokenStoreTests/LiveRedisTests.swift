import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import ServerSupport
import Testing

@testable import RedisTokenStore

/// A server a test started did not accept connections within the hang guard.
struct ServerDidNotStart: Error, CustomStringConvertible {
    let what: String
    var description: String { "\(what) did not accept connections within 60 s" }
}

/// Starts `redis-server` with the arguments `arguments` makes for a free loopback port (output to
/// /dev/null) and returns its pid and port once `isReady` says it serves on that port.
///
/// A port `freeLoopbackPort()` found free can be taken before the server binds it: another test's
/// outgoing connection may get it as its local port. The server then exits at once; this sees the
/// exit and starts it again on another port (5 tries), instead of waiting on a port nobody serves.
/// - Throws: `ServerDidNotStart` when it never became ready (within `waitBoundSeconds`, a guard
///   against a hang, not a timing assertion: a loaded machine, two sanitizer runs beside other
///   work, has taken more than 5 s to start one; the wait has failed the test) or exited on every try; an error of `arguments`; `CocoaError` when it
///   cannot be spawned.
func startRedisServer(
    _ what: String, arguments: (Int) throws -> [String], isReady: (Int) -> Bool
) throws -> (pid: pid_t, port: Int) {
    for _ in 0..<5 {
        let port = try freeLoopbackPort()
        let argumentList = try arguments(port)
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        var argv: [UnsafeMutablePointer<CChar>?] = (["redis-server"] + argumentList).map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }
        var pid: pid_t = 0
        // Spawned with posix_spawn: Foundation's Process leaks a weak reference per run, which
        // LeakSanitizer reports.
        guard posix_spawnp(&pid, "redis-server", &actions, nil, &argv, environ) == 0 else {
            throw CocoaError(.executableNotLoadable)
        }
        var status: Int32 = 0
        var exited = false
        let settled = waitUntil("\(what) on port \(port) to be ready, or to exit") {
            if isReady(port) { return true }
            exited = waitpid(pid, &status, WNOHANG) == pid  // it exited: the port was taken
            return exited
        }
        if settled && !exited { return (pid, port) }
        if !settled {
            kill(pid, SIGKILL)
            waitpid(pid, &status, 0)
            break
        }
    }
    throw ServerDidNotStart(what: what)
}

/// A `redis-server` started for one test on a free loopback port (`--save '' --appendonly no`),
/// stopped by its pid.
final class RedisServerProcess {
    let port: Int
    /// The server's pid.
    let pid: pid_t

    /// Starts a server; with `tls`, the port is its TLS port (`--port 0 --tls-port PORT` and the
    /// `--tls-*` arguments `tls` holds) and the server is ready once it accepts TCP connections.
    init(extra: [String] = [], tls: [String]? = nil) throws {
        (pid, port) = try startRedisServer(
            "redis-server",
            arguments: { port in
                let ports = tls.map { ["--port", "0", "--tls-port", String(port)] + $0 } ?? ["--port", String(port)]
                return ports + ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"] + extra
            },
            isReady: { port in
                if tls != nil {
                    guard
                        let fd = try? RedisSocket.connectTCP(
                            host: "127.0.0.1", port: port, deadline: monotonicSeconds() + 1)
                    else { return false }
                    close(fd)
                    return true
                }
                do throws(RedisConnectionError) {
                    _ = try RedisConnection(
                        endpoint: RedisEndpoint(address: .tcp(host: "127.0.0.1", port: port)), timeout: 1)
                    return true
                } catch {
                    // With --requirepass a refusal of the credentials also proves the server is up.
                    if case .authFailed = error { return true }
                    return false
                }
            })
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

/// The owner's rendition in these tests: the state alone.
struct PlainRendition: TokenRendition {
    let state: TokenState
    init(_ state: TokenState) { self.state = state }
}

/// Forwards everything to the store under test and records what the store reports to the owner.
final class RecordingStore: TokenStore {
    let inner: RedisTokenStore
    let events = Locked<[TokenStoreEvent]>([])
    init(_ inner: RedisTokenStore) { self.inner = inner }
    var ordering: CommitOrdering { inner.ordering }
    func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?
    {
        inner.commit(token, base: base, completion: completion)
    }
    func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void, current: @escaping @Sendable () -> TokenState
    ) {
        inner.start(
            reporting: { [events] event in
                events.withLock { $0.append(event) }
                report(event)
            }, current: current)
    }
    func stop() { inner.stop() }
    func refresh() { inner.refresh() }
    func status() -> StoreStatus { inner.status() }
    /// The states reported as `.changed`, in order.
    var changes: [TokenState] {
        events.withLock { $0.compactMap { if case .changed(let state) = $0 { state } else { nil } } }
    }
}

/// A replica as production runs it: a `TokenOwner` over a `RedisTokenStore` through the
/// `TokenStore` conformance (`start`, `commit`, `.changed` and `.health` reports, `close`).
final class ReplicaModel: Sendable {
    let store: RedisTokenStore
    let recorder: RecordingStore
    let owner: TokenOwner<PlainRendition>

    init(
        port: Int, password: String? = nil, user: String? = nil, prefix: String = "test", queueCapacity: Int = 4096,
        checkInterval: Double = 0.5, host: String = "127.0.0.1", tls: RedisTLSSettings? = nil, url: String? = nil,
        clock: ServerClock = .monotonic, log: @escaping @Sendable (ServerLogLevel, String) -> Void = { _, _ in }
    ) {
        var endpoint = RedisEndpoint(address: .tcp(host: host, port: port), tls: tls != nil)
        if let url { endpoint = try! RedisEndpoint.parse(url) }
        endpoint.password = password.map { Array($0.utf8) }
        endpoint.user = user
        var configuration = RedisTokenStore.Configuration(endpoint: endpoint, prefix: RedisKeyPrefix(prefix)!)
        configuration.checkInterval = checkInterval
        configuration.queueCapacity = queueCapacity
        configuration.tls = tls ?? RedisTLSSettings()
        configuration.clock = clock
        store = RedisTokenStore(configuration: configuration, log: log)
        recorder = RecordingStore(store)
        owner = TokenOwner(
            store: recorder, initial: .initial, health: RedisTokenStore.healthAtStart, maxSubscribers: 8)
        owner.start()
    }

    /// The link's health as `/healthz` names it.
    var link: String { store.linkHealth }

    /// The owner's state once it read one, else `nil` (the owner is still `.starting`).
    var current: TokenState? {
        if case .starting = owner.health { return nil }
        return owner.current.state
    }

    /// One write through the owner, waiting for its outcome.
    func commit(_ token: String?) -> CommitOutcome {
        let pending: PendingCommit
        switch owner.commit(token) {
        case .decided(let outcome): return outcome
        case .pending(let commit): pending = commit
        }
        let result = Locked<CommitOutcome?>(nil)
        let done = DispatchSemaphore(value: 0)
        if let outcome = pending.outcome(orWhenDecided: { outcome in
            result.withLock { $0 = outcome }
            done.signal()
        }) {
            return outcome
        }
        done.wait()
        return result.withLock { $0 }!
    }

    deinit { owner.close() }
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
        // Nothing more is there (a poll that does not wait), and a deadline that has come ends the
        // wait at once: no test time is spent waiting for a timeout.
        #expect(try client.pollReply(milliseconds: 0) == nil)
        #expect(throws: RedisConnectionError.timedOut) { try client.readReply(deadline: monotonicSeconds()) }
    }

    @Test func aHungRedisGivesUnknownInTwoSecondsAndAFullQueueRefusesAtOnce() throws {
        let redis = try RedisServerProcess()
        // On a manual clock: the write's deadline, the writer's read of its batch and the
        // heartbeat's timeout pass when the test moves the time, not after real seconds.
        let clock = ManualServerClock()
        let a = ReplicaModel(port: redis.port, queueCapacity: 2, clock: .manual(clock))
        waitUntil(#"a.link == "connected" && a.owner.health == .ok"#) { a.link == "connected" && a.owner.health == .ok }
        kill(redis.pid, SIGSTOP)
        defer { kill(redis.pid, SIGCONT) }
        let outcomes = Locked<[CommitOutcome]>([])
        let done = DispatchSemaphore(value: 0)
        // The first batch blocks the writer on the hung Redis (the test waits for the writer to
        // take it from the queue, not for a time); 2 more fill the queue; the rest are refused at
        // once.
        for n in 0..<6 {
            let completion: @Sendable (CommitOutcome) -> Void = { outcome in
                outcomes.withLock { $0.append(outcome) }
                done.signal()
            }
            if let refused = a.store.commit(String(format: "%02x", n), base: .initial, completion: completion) {
                completion(refused)
            }
            if n == 0 { waitUntil("the writer to take the first write") { a.store.link.queue.changeCount == 0 } }
        }
        let refusedAtOnce = outcomes.withLock { $0.filter { $0 == .unavailable(reason: "Redis: unreachable") }.count }
        #expect(refusedAtOnce >= 2)
        func unknowns() -> Int {
            outcomes.withLock { $0.filter { if case .unknown = $0 { true } else { false } }.count }
        }
        // 1.9 s of the clock: the deadline thread has looked at the time and sleeps again, and no
        // write is answered yet.
        clock.advance(by: .milliseconds(1900))
        let early = clock.waitsBegun
        clock.advance(by: .zero)
        waitUntil("the deadline thread to sleep again at 1.9 s") { clock.isWaiting(after: early) }
        #expect(unknowns() == 0, "a write timed out before its 2 s")
        #expect(outcomes.withLock { $0.count } == refusedAtOnce)
        // Past the 2 s: the batch in flight and the queued ones are answered `.unknown` (by the
        // deadline thread or the writer, whichever looks first). How soon after in real time, a
        // timing contract, is the release binary's to show: e2e/replicas_test.py (e), a write to
        // a hung Redis answered in 2.8 s.
        clock.advance(by: .milliseconds(101))
        waitUntil("every write answered") { outcomes.withLock { $0.count } == 6 }
        #expect(unknowns() == 6 - refusedAtOnce)
        // The unanswered PING: the owner hears that the state it serves may be stale, once the
        // heartbeat's timeout has passed on the clock (moved 100 ms per look of this wait).
        waitUntil(#"a.owner.health == .degraded(reason: HealthReason(rawValue: "unreachable"))"#) {
            clock.advance(by: .milliseconds(100))
            return a.owner.health == .degraded(reason: HealthReason(rawValue: "unreachable"))
        }
        kill(redis.pid, SIGCONT)
        waitUntil(#"a.link == "connected" && a.owner.health == .ok"#) { a.link == "connected" && a.owner.health == .ok }
        guard case .applied(let state) = a.commit("ff") else {
            Issue.record("no write after SIGCONT")
            return
        }
        #expect(state.token == "ff")
        #expect(a.owner.current.state == state)
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

    /// The `TokenStore` conformance production uses, through a `TokenOwner`: ordering, the
    /// replica name, `storeHealth` from `.starting` to `.ok`, commits answered `.applied` and
    /// `.unchanged` with Redis' state, and changes from another replica applied.
    @Test func changesReachEveryReplicaWithTheSameVersion() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port)
        let b = ReplicaModel(port: redis.port)
        #expect(a.store.ordering == .storeSerialized && a.store.replicaName == "redis")
        waitUntil("both replicas connected and ok") {
            a.link == "connected" && b.link == "connected" && a.owner.health == .ok && b.owner.health == .ok
        }
        #expect(a.current == TokenState(version: 0, token: nil))
        #expect(a.commit("aa01") == .applied(TokenState(version: 1, token: "aa01")))
        #expect(a.owner.current.state == TokenState(version: 1, token: "aa01"))
        waitUntil(#"b.current == TokenState(version: 1, token: "aa01")"#) {
            b.current == TokenState(version: 1, token: "aa01")
        }
        // The same token again through the other replica changes nothing.
        #expect(b.commit("aa01") == .unchanged(TokenState(version: 1, token: "aa01")))
        #expect(b.commit(nil) == .applied(TokenState(version: 2, token: nil)))
        #expect(a.commit(nil) == .unchanged(TokenState(version: 2, token: nil)))
        waitUntil(#"a.current == TokenState(version: 2, token: nil)"#) {
            a.current == TokenState(version: 2, token: nil)
        }
        let client = try redis.client()
        #expect(try hash(client, "test:state") == ["version": "2"])
        // After SCRIPT FLUSH the writer falls back to EVAL.
        #expect(try client.command(["SCRIPT", "FLUSH"], timeout: 2) == .status("OK"))
        #expect(a.commit("bb") == .applied(TokenState(version: 3, token: "bb")))
        let metrics = a.store.metricsText()
        #expect(metrics.contains("forge_push_token_redis_up 1\n"))
        #expect(metrics.contains("forge_push_token_redis_write_seconds_count 3\n"))
    }

    /// A change is applied to the owner once: this replica's write reaches its owner through the
    /// commit's completion alone (its own change message and the checks that read it again are
    /// not reported), and another replica's write arrives as one `.changed` report.
    @Test func oneWriteThroughRedisReachesTheOwnerOnce() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port, checkInterval: 0.2)
        let b = ReplicaModel(port: redis.port, checkInterval: 0.2)
        waitUntil(#"a.link == "connected" && b.link == "connected""#) { a.link == "connected" && b.link == "connected" }
        let mine = TokenState(version: 1, token: "a1")
        #expect(a.commit("a1") == .applied(mine))
        // B's write comes after A's own change message on the channel and after checks that read
        // A's write again: once A has it, whatever A's write caused has been reported.
        waitUntil(#"b.current == mine"#) { b.current == mine }
        let theirs = TokenState(version: 2, token: "b2")
        #expect(b.commit("b2") == .applied(theirs))
        waitUntil(#"a.current == theirs"#) { a.current == theirs }
        #expect(a.recorder.changes.filter { $0 == mine }.isEmpty, "\(a.recorder.changes)")
        #expect(a.recorder.changes.filter { $0 == theirs }.count == 1, "\(a.recorder.changes)")
        #expect(b.recorder.changes.filter { $0 == mine }.count == 1, "\(b.recorder.changes)")
        #expect(b.recorder.changes.filter { $0 == theirs }.isEmpty, "\(b.recorder.changes)")
    }

    @Test func dataLossIsWrittenBackAndTiesBumpTheVersion() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port)
        waitUntil(#"a.link == "connected""#) { a.link == "connected" }
        for token in ["01", "02", "03"] { _ = a.commit(token) }
        let client = try redis.client()
        #expect(try client.command(["FLUSHALL"], timeout: 2) == .status("OK"))
        // The periodic check finds the key missing and writes the replica's state back.
        waitUntil(#"(try? hash(client, "test:state")) == ["version": "3", "token": "03"]"#) {
            (try? hash(client, "test:state")) == ["version": "3", "token": "03"]
        }
        // Lower in Redis than in the replica: written back as well.
        _ = try client.command(["HSET", "test:state", "version", "1", "token", "01"], timeout: 2)
        waitUntil(#"(try? hash(client, "test:state")) == ["version": "3", "token": "03"]"#) {
            (try? hash(client, "test:state")) == ["version": "3", "token": "03"]
        }
        // Same version, another token: the stored token wins at the next version.
        _ = try client.command(["HSET", "test:state", "version", "3", "token", "ee"], timeout: 2)
        waitUntil(#"a.current == TokenState(version: 4, token: "ee")"#) {
            a.current == TokenState(version: 4, token: "ee")
        }
        #expect(try hash(client, "test:state") == ["version": "4", "token": "ee"])
        // A newer version set elsewhere is adopted, never overwritten.
        _ = try client.command(["HSET", "test:state", "version", "10", "token", "ff"], timeout: 2)
        waitUntil(#"a.current == TokenState(version: 10, token: "ff")"#) {
            a.current == TokenState(version: 10, token: "ff")
        }
        #expect(a.commit("ff") == .unchanged(TokenState(version: 10, token: "ff")))
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
            waitUntil("link invalid_state and health starting (invalid_state)") {
                a.link == "invalid_state"
                    && a.owner.health == .starting(reason: HealthReason(rawValue: "invalid_state"))
            }
            #expect(a.commit("ab") == .unavailable(reason: "Redis: invalid_state"))
            let stored =
                setup[0] == "SET"
                ? try client.command(["GET", "test:state"], timeout: 2)
                : try client.command(["HGET", "test:state", "version"], timeout: 2)
            #expect(stored == expected)
            // Repaired by deleting the key: the replica recovers.
            _ = try client.command(["DEL", "test:state"], timeout: 2)
            waitUntil(#"a.link == "connected" && a.owner.health == .ok"#) {
                a.link == "connected" && a.owner.health == .ok
            }
            #expect(a.commit("ab") == .applied(TokenState(version: 1, token: "ab")))
            _ = try client.command(["DEL", "test:state"], timeout: 2)
        }
    }

    /// Issue 21 §1: Lua numbers are doubles, so a version above 2^53 - 1 in `PREFIX:state` is
    /// `invalid_state` (never rounded, never overwritten, no write answered as a change), and no
    /// script writes a version past 2^53 - 1: at the last one, a change is refused.
    @Test func versionsPast2To53AreInvalidAndNeverWritten() throws {
        let redis = try RedisServerProcess()
        let client = try redis.client()
        for version in ["9007199254740993", "9007199254740992", "18446744073709551615"] {
            _ = try client.command(["DEL", "test:state"], timeout: 2)
            _ = try client.command(["HSET", "test:state", "version", version, "token", "99aabbcc"], timeout: 2)
            let a = ReplicaModel(port: redis.port)
            waitUntil("link invalid_state and health starting (invalid_state) at version \(version)") {
                a.link == "invalid_state"
                    && a.owner.health == .starting(reason: HealthReason(rawValue: "invalid_state"))
            }
            #expect(a.commit("a1a1a1a1") == .unavailable(reason: "Redis: invalid_state"))
            #expect(try hash(client, "test:state") == ["version": version, "token": "99aabbcc"])
            #expect(a.current == nil)
        }
        // At 2^53 - 1: served, but a change would pass it and is refused; Redis keeps the state.
        _ = try client.command(["DEL", "test:state"], timeout: 2)
        _ = try client.command(["HSET", "test:state", "version", "9007199254740991", "token", "99aabbcc"], timeout: 2)
        let a = ReplicaModel(port: redis.port)
        // Served, but the link says why no change can be made (not `connected`).
        waitUntil("link version_exhausted, health degraded, version 2^53 - 1 served") {
            a.link == "version_exhausted"
                && a.owner.health == .degraded(reason: HealthReason(rawValue: "version_exhausted"))
                && a.current == TokenState(version: 9_007_199_254_740_991, token: "99aabbcc")
        }
        #expect(a.commit("99aabbcc") == .unchanged(TokenState(version: 9_007_199_254_740_991, token: "99aabbcc")))
        #expect(a.commit("a1a1a1a1") == .versionExhausted, "a change past 2^53 - 1 was not refused")
        #expect(try hash(client, "test:state") == ["version": "9007199254740991", "token": "99aabbcc"])
        #expect(a.current == TokenState(version: 9_007_199_254_740_991, token: "99aabbcc"))
    }

    @Test func wrongCredentialsAndNoServer() throws {
        let redis = try RedisServerProcess(extra: ["--requirepass", "right"])
        let wrong = ReplicaModel(port: redis.port, password: "wrong")
        waitUntil("link auth_failed and health starting (auth_failed)") {
            wrong.link == "auth_failed"
                && wrong.owner.health == .starting(reason: HealthReason(rawValue: "auth_failed"))
        }
        #expect(wrong.commit("aa") == .unavailable(reason: "Redis: auth_failed"))
        let missing = ReplicaModel(port: redis.port)
        waitUntil(#"missing.link == "auth_failed""#) { missing.link == "auth_failed" }
        let right = ReplicaModel(port: redis.port, password: "right")
        waitUntil(#"right.link == "connected""#) { right.link == "connected" }
        let wrongUser = ReplicaModel(port: redis.port, password: "right", user: "nobody")
        waitUntil(#"wrongUser.link == "auth_failed""#) { wrongUser.link == "auth_failed" }

        let nothing = ReplicaModel(port: try freeLoopbackPort())
        #expect(nothing.commit("aa") == .unavailable(reason: "Redis: unreachable"))
        #expect(nothing.link == "unreachable")
        #expect(nothing.owner.health == .starting(reason: HealthReason(rawValue: "unreachable")))
        #expect(nothing.current == nil)
    }

    @Test func aWriteOnADeadIdleConnectionIsSentAgainOnANewOne() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port)
        waitUntil(#"a.link == "connected""#) { a.link == "connected" }
        #expect(a.commit("01") == .applied(TokenState(version: 1, token: "01")))
        // Kills the writer's idle connection (and not this client's: SKIPME yes is the default).
        let client = try redis.client()
        #expect(try client.command(["CLIENT", "KILL", "TYPE", "normal"], timeout: 2) != .null)
        #expect(a.commit("02") == .applied(TokenState(version: 2, token: "02")))
    }

    @Test func reconnectsAfterTheSubscriptionIsKilled() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port)
        let b = ReplicaModel(port: redis.port)
        waitUntil(#"a.link == "connected" && b.link == "connected""#) { a.link == "connected" && b.link == "connected" }
        let client = try redis.client()
        _ = try client.command(["CLIENT", "KILL", "TYPE", "pubsub"], timeout: 2)
        _ = a.commit("cafe")
        waitUntil(#"b.current == TokenState(version: 1, token: "cafe")"#) {
            b.current == TokenState(version: 1, token: "cafe")
        }
        waitUntil(#"b.store.metricsText().contains("forge_push_token_redis_reconnects_total 1\n")"#) {
            b.store.metricsText().contains("forge_push_token_redis_reconnects_total 1\n")
        }
    }

    /// Issue 21 §6: many streams opening with a `Last-Event-ID` above the replica's version cost
    /// Redis a bounded number of checks (at most one in flight, one per 100 ms), not one each.
    @Test func refreshesAreCoalesced() throws {
        let redis = try RedisServerProcess()
        let clock = ManualServerClock()
        let a = ReplicaModel(port: redis.port, checkInterval: 3600, clock: .manual(clock))
        waitUntil(#"a.link == "connected""#) { a.link == "connected" }
        let client = try redis.client()
        let before = try scriptCalls(client)
        for _ in 0..<1000 { a.store.refresh() }
        // A write goes through the same queue as the checks the refreshes asked for, after them.
        #expect(a.commit("ab") == .applied(TokenState(version: 1, token: "ab")))
        // On a frozen clock the bound is exact: one check at once, the rest kept for later.
        #expect(
            try scriptCalls(client) - before - 1 == 1, "1000 refreshes on a frozen clock: one check, not one per call")
        // 100 ms later on the clock (and a microsecond: the link's seconds are `Double`s near
        // 10^6, rounded), the one kept for later, at the subscription's next tick.
        clock.advance(by: .microseconds(100_001))
        try waitUntil("the check kept for later") { try scriptCalls(client) - before - 1 == 2 }
    }
}

/// The `EVALSHA` and `EVAL` calls Redis counted (`INFO commandstats`).
func scriptCalls(_ connection: RedisConnection) throws -> Int {
    guard let text = try connection.command(["INFO", "commandstats"], timeout: 2).text else { return 0 }
    var calls = 0
    for line in text.split(whereSeparator: \.isNewline)
    where line.hasPrefix("cmdstat_evalsha:") || line.hasPrefix("cmdstat_eval:") {
        if let field = line.split(separator: ":").last?.split(separator: ",").first,
            field.hasPrefix("calls="), let count = Int(field.dropFirst("calls=".count))
        {
            calls += count
        }
    }
    return calls
}
