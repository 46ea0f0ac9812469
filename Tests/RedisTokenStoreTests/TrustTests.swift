import CHiredis
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import ServerSupport
import Testing

@testable import RedisTokenStore

/// What a replica trusts (docs/replicas.md, "What a replica trusts"; issue 27): change messages
/// are notifications, replies are bounded, the sentinels' majority decides the master, and the
/// log lines Redis traffic causes are limited. Values first, then against a real `redis-server`.
@Suite struct TrustValueTests {
    typealias Machine = RedisLinkStateMachine

    static func connected() -> Machine {
        var link = Machine(endpoint: "redis://127.0.0.1:6379/0", prefix: "p")
        _ = link.subscribed(at: 0)
        _ = link.checkSucceeded(at: 0.1, read: TokenState(version: 3, token: "aa"))
        return link
    }

    @Test func anAnnouncedChangeIsReadNotApplied() {
        var link = Self.connected()
        // The announcement asks for a read; the machine never hands on the announced state.
        #expect(link.changeAnnounced(TokenState(version: 9, token: "bb")) == [.requestCheck])
        // The read holds it: nothing to count.
        #expect(link.checkSucceeded(at: 1, read: TokenState(version: 9, token: "bb")) == [])
        #expect(link.announced == nil)
        // A read that holds a later state supersedes the announcement.
        _ = link.changeAnnounced(TokenState(version: 10, token: "cc"))
        #expect(link.checkSucceeded(at: 2, read: TokenState(version: 11, token: nil)) == [])
    }

    @Test func anAnnouncementTheKeyDoesNotHoldIsCounted() {
        var link = Self.connected()
        #expect(link.changeAnnounced(TokenState(version: 9_007_199_254_740_991, token: "deadbeef")) == [.requestCheck])
        let actions = link.checkSucceeded(at: 1, read: TokenState(version: 3, token: "aa"))
        #expect(actions.count == 1)
        guard case .ignored(.unconfirmed, let detail) = actions.first else {
            Issue.record("expected an unconfirmed message, got \(actions)")
            return
        }
        #expect(detail.contains("9007199254740991") && detail.contains("p:state holds version 3"))
        // Same version, another token: not what the key holds either.
        _ = link.changeAnnounced(TokenState(version: 3, token: "bb"))
        #expect(link.checkSucceeded(at: 2, read: TokenState(version: 3, token: "aa")).count == 1)
    }

    @Test func announcementsDuringARunningReadAskForOneMoreReadAfterIt() {
        var link = Self.connected()
        // A periodic check is running when messages arrive.
        #expect(link.tick(at: 2.2).contains(.requestCheck))
        #expect(link.changeAnnounced(TokenState(version: 4, token: "b1")) == [])
        #expect(link.changeAnnounced(TokenState(version: 5, token: "b2")) == [])
        #expect(link.changeAnnounced(TokenState(version: 6, token: "b3")) == [])
        // The running read began before the messages: it does not judge them, one more read does.
        #expect(link.checkSucceeded(at: 2.3, read: TokenState(version: 3, token: "aa")) == [.requestCheck])
        #expect(link.checkSucceeded(at: 2.4, read: TokenState(version: 6, token: "b3")) == [])
        #expect(link.announced == nil)
    }

    @Test func aRealChangeBehindAForgedHigherOneIsReadAfterIt() {
        var link = Self.connected()
        // A forged announcement far above: its read runs.
        #expect(link.changeAnnounced(TokenState(version: 9_007_199_254_740_991, token: "ff")) == [.requestCheck])
        // A real change arrives while that read runs, which may have read the key before it.
        #expect(link.changeAnnounced(TokenState(version: 4, token: "b1")) == [])
        // So one more read follows (attack finding: the real change waited up to 2 s).
        #expect(link.checkSucceeded(at: 1, read: TokenState(version: 3, token: "aa")) == [.requestCheck])
        #expect(link.checkSucceeded(at: 1.1, read: TokenState(version: 4, token: "b1")).count == 1)
    }

    @Test func aResubscribeDuringARunningReadReadsAgainAfterIt() {
        var link = Self.connected()
        #expect(link.tick(at: 2.2).contains(.requestCheck))
        _ = link.subscriptionFailed(.unreachable, detail: "closed", at: 2.25)
        // Subscribe-then-read: the running read may predate the subscription.
        #expect(link.subscribed(at: 2.3) == [])
        #expect(link.checkSucceeded(at: 2.35, read: TokenState(version: 3, token: "aa")).contains(.requestCheck))
    }

    @Test func logLinesAreLimitedPerKindWithACountOfWhatWasLeftOut() {
        var limiter = LogRateLimiter()
        let start = ContinuousClock.now
        func at(_ seconds: Double) -> ContinuousClock.Instant { start + .milliseconds(Int64(seconds * 1000)) }
        #expect(limiter.admit("ignored.malformed", at: at(0)) == 0)
        for step in 1...999 { #expect(limiter.admit("ignored.malformed", at: at(Double(step) / 100)) == nil) }
        // Another kind has its own budget.
        #expect(limiter.admit("ignored.probe", at: at(1)) == 0)
        #expect(limiter.admit("ignored.malformed", at: at(10)) == 999)
        #expect(limiter.admit("ignored.malformed", at: at(10.5)) == nil)
        #expect(
            LogRateLimiter.annotate("x", leftOut: 999)
                == "x (999 more lines like it left out in the last 10 s or more)")
        #expect(LogRateLimiter.annotate("x", leftOut: 0) == "x")
    }

    static let a = RedisEndpoint.Host(host: "10.0.0.1", port: 6379)
    static let b = RedisEndpoint.Host(host: "10.0.0.2", port: 6379)
    static let fake = RedisEndpoint.Host(host: "203.0.113.9", port: 6379)
    static func sentinel(_ index: Int) -> RedisEndpoint.Host { .init(host: "127.0.0.1", port: 26379 + index) }

    @Test func theMasterIsWhatAMajorityOfTheConfiguredSentinelsName() {
        typealias Directory = RedisSentinelDirectory
        let honest = Result<Directory.Answer, RedisConnectionError>.success(.init(master: Self.a, replicas: [Self.b]))
        let rogue = Result<Directory.Answer, RedisConnectionError>.success(.init(master: Self.fake, replicas: []))
        // A rogue sentinel answering first decides nothing.
        #expect(Directory.decide([(Self.sentinel(0), rogue)], configured: 3, complete: false) == .waiting)
        #expect(
            Directory.decide([(Self.sentinel(0), rogue), (Self.sentinel(1), honest)], configured: 3, complete: false)
                == .waiting)
        let decided = Directory.decide(
            [(Self.sentinel(0), rogue), (Self.sentinel(1), honest), (Self.sentinel(2), honest)], configured: 3,
            complete: false)
        #expect(decided == .agreed(.init(master: Self.a, replicas: [Self.b])))
        // Two honest answers of three decide at once, without waiting for the third.
        #expect(
            Directory.decide([(Self.sentinel(0), honest), (Self.sentinel(1), honest)], configured: 3, complete: false)
                == .agreed(.init(master: Self.a, replicas: [Self.b])))
        // Time is up with one answer of three: no majority, no master.
        guard
            case .failed(.noMaster(let why)) = Directory.decide(
                [(Self.sentinel(0), honest)], configured: 3, complete: true)
        else {
            Issue.record("expected no_master")
            return
        }
        #expect(why.contains("no majority of the 3 sentinels"))
        // Two configured, one down: no majority (configure three).
        let down = Result<Directory.Answer, RedisConnectionError>.failure(.unreachable("refused"))
        guard
            case .failed(.noMaster) = Directory.decide(
                [(Self.sentinel(0), honest), (Self.sentinel(1), down)], configured: 2, complete: true)
        else {
            Issue.record("expected no_master with one of two sentinels down")
            return
        }
        // One configured: that sentinel is trusted.
        #expect(
            Directory.decide([(Self.sentinel(0), rogue)], configured: 1, complete: false)
                == .agreed(.init(master: Self.fake, replicas: [])))
        // None answers: sentinels_unreachable; every refusal a password refusal: auth_failed.
        guard
            case .failed(.sentinelsUnreachable) = Directory.decide(
                [(Self.sentinel(0), down)], configured: 1, complete: true)
        else {
            Issue.record("expected sentinels_unreachable")
            return
        }
        let refused = Result<Directory.Answer, RedisConnectionError>.failure(.authFailed("WRONGPASS"))
        guard case .failed(.authFailed) = Directory.decide([(Self.sentinel(0), refused)], configured: 1, complete: true)
        else {
            Issue.record("expected auth_failed")
            return
        }
    }

    @Test func onlyReplicasAMajorityListsAreTrustedOnASwitch() {
        typealias Directory = RedisSentinelDirectory
        let honest = Result<Directory.Answer, RedisConnectionError>.success(.init(master: Self.a, replicas: [Self.b]))
        let rogue = Result<Directory.Answer, RedisConnectionError>.success(
            .init(master: Self.a, replicas: [Self.b, Self.fake]))
        let decided = Directory.decide(
            [(Self.sentinel(0), rogue), (Self.sentinel(1), honest), (Self.sentinel(2), honest)], configured: 3,
            complete: true)
        #expect(decided == .agreed(.init(master: Self.a, replicas: [Self.b])))
        let directory = Directory(
            .init(hosts: [Self.sentinel(0), Self.sentinel(1), Self.sentinel(2)], masterName: "m"))
        guard case .agreed(let agreement) = decided else { return }
        directory.using(Self.a)
        #expect(!directory.refreshed(agreement))
        #expect(directory.isKnownReplica(Self.b) && !directory.isKnownReplica(Self.fake))
        let before = directory.generation
        #expect(directory.switched(to: Self.b))
        #expect(directory.generation == before + 1)
        // The same announcement again moves nothing.
        #expect(!directory.switched(to: Self.b))
        #expect(directory.generation == before + 1)
    }

    /// Feeds `bytes` to a reader with the bounds installed: the reply, or which bound refused it.
    static func read(_ bytes: String) -> (reply: Bool, refusal: RedisReplyLimits.Refusal?) {
        let reader = redisReaderCreate()!
        defer { redisReaderFree(reader) }
        let tally = UnsafeMutablePointer<RedisReplyLimits.Tally>.allocate(capacity: 1)
        tally.initialize(to: RedisReplyLimits.Tally())
        defer { tally.deallocate() }
        RedisReplyLimits.install(on: reader, tally: tally)
        _ = Array(bytes.utf8).withUnsafeBytes {
            redisReaderFeed(reader, $0.baseAddress?.assumingMemoryBound(to: CChar.self), $0.count)
        }
        var raw: UnsafeMutableRawPointer?
        let status = redisReaderGetReply(reader, &raw)
        if let raw { freeReplyObject(raw) }
        return (status == REDIS_OK && raw != nil, RedisReplyLimits.Refusal(rawValue: tally.pointee.refusal))
    }

    @Test func theReaderRefusesRepliesOverTheBoundsBeforeBuildingThem() {
        let ints = { (count: Int) in String(repeating: ":1\r\n", count: count) }
        #expect(Self.read("*64\r\n" + ints(64)) == (true, nil))
        #expect(Self.read("*65\r\n" + ints(65)) == (false, .elements))
        #expect(Self.read("*2000000000\r\n" + ints(10)) == (false, .elements))
        #expect(Self.read("*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n") == (true, nil))
        #expect(Self.read("*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n") == (false, .depth))
        let bulk = { (count: Int) in "$\(count)\r\n" + String(repeating: "x", count: count) + "\r\n" }
        #expect(Self.read(bulk(65536)) == (true, nil))
        #expect(Self.read(bulk(65537)) == (false, .bulk))
        // Each bound alone allows 64^4 leaves; the reply's totals do not (attack finding: +367 MB).
        let nested = "*64\r\n*64\r\n" + String(repeating: "*64\r\n" + ints(64), count: 64)
        #expect(Self.read(nested) == (false, .total))
        let strings = String(repeating: bulk(60000), count: 5)
        #expect(Self.read("*64\r\n*64\r\n" + strings) == (false, .total))
        // A sentinel's list of 64 replicas of 42 fields each fits.
        let replica = "*42\r\n" + String(repeating: "$12\r\nabcdefghijkl\r\n", count: 42)
        #expect(Self.read("*64\r\n" + String(repeating: replica, count: 64)) == (true, nil))
    }
}

/// The same promises against a real `redis-server`.
@Suite(.serialized) struct LiveTrustTests {
    /// Issue 27 §1: one `PUBLISH` of a state the key does not hold, with the highest version or
    /// the next one, changes neither replica's token nor `PREFIX:state`, and writes go on.
    @Test func aForgedChangeMessageChangesNothing() throws {
        let redis = try RedisServerProcess()
        let a = ReplicaModel(port: redis.port, prefix: "forge-push-token")
        let b = ReplicaModel(port: redis.port, prefix: "forge-push-token")
        waitUntil(#"a.link == "connected" && b.link == "connected""#) { a.link == "connected" && b.link == "connected" }
        #expect(a.commit("aa01") == .applied(TokenState(version: 1, token: "aa01")))
        waitUntil(#"b.current == TokenState(version: 1, token: "aa01")"#) {
            b.current == TokenState(version: 1, token: "aa01")
        }
        let client = try redis.client()
        for (index, forged) in [
            "{\"version\":9007199254740991,\"token\":\"deadbeef\"}", "{\"version\":2,\"token\":\"deadbeef\"}",
            "{\"version\":2,\"token\":\"deadbeef\",\"writer\":\"1234\"}",
        ].enumerated() {
            #expect(
                try client.command(["PUBLISH", "forge-push-token:changes", forged], timeout: 2) == .integer(2))
            // The event that must come: each replica read the key and counted the message.
            let counted = "forge_push_token_redis_ignored_messages_total{kind=\"unconfirmed\"} \(index + 1)\n"
            waitUntil(#"a.store.metricsText().contains(counted) && b.store.metricsText().contains(counted)"#) {
                a.store.metricsText().contains(counted) && b.store.metricsText().contains(counted)
            }
            #expect(a.owner.current.state == TokenState(version: 1, token: "aa01"))
            #expect(b.owner.current.state == TokenState(version: 1, token: "aa01"))
            #expect(try hash(client, "forge-push-token:state") == ["version": "1", "token": "aa01"])
        }
        // A periodic check (every 0.5 s here) writes nothing back either; writes go on.
        #expect(a.commit("bb02") == .applied(TokenState(version: 2, token: "bb02")))
        waitUntil(#"b.current == TokenState(version: 2, token: "bb02")"#) {
            b.current == TokenState(version: 2, token: "bb02")
        }
        #expect(try hash(client, "forge-push-token:state") == ["version": "2", "token": "bb02"])
        #expect(a.link == "connected" && b.link == "connected")
    }

    /// Issue 27 §2: a reply over 64 KiB is refused on an ordinary connection, and an oversized
    /// message on the subscription is counted and subscribed again, the health unchanged.
    @Test func oversizedRepliesAreRefusedAndTheSubscriptionComesBack() throws {
        let redis = try RedisServerProcess()
        let client = try redis.client()
        let big = String(repeating: "x", count: 100_000)
        #expect(try client.command(["SET", "big", big], timeout: 2) == .status("OK"))
        let reader = try redis.client()
        #expect(throws: RedisConnectionError.self) { _ = try reader.command(["GET", "big"], timeout: 2) }
        do {
            _ = try reader.command(["GET", "big"], timeout: 2)
        } catch {
            guard case .replyTooLarge = error else { throw error }
        }
        let replica = ReplicaModel(port: redis.port)
        // The owner hears of the health after the link decides it: wait for both.
        waitUntil(#"replica.link == "connected" && replica.owner.health == .ok"#) {
            replica.link == "connected" && replica.owner.health == .ok
        }
        _ = try client.command(["PUBLISH", "test:changes", big], timeout: 2)
        waitUntil(#"replica.store.metricsText().contains("ignored_messages_total{kind=\"oversized\"} 1\n")"#) {
            replica.store.metricsText().contains("ignored_messages_total{kind=\"oversized\"} 1\n")
        }
        waitUntil(#"replica.store.metricsText().contains("forge_push_token_redis_reconnects_total 1\n")"#) {
            replica.store.metricsText().contains("forge_push_token_redis_reconnects_total 1\n")
        }
        #expect(replica.owner.health == .ok)
        #expect(replica.commit("cc03") == .applied(TokenState(version: 1, token: "cc03")))
    }

    /// Issue 27 §5: 2,000 garbage messages make one log line (and the rest are counted).
    @Test func aFloodOfGarbageMakesOneLogLine() throws {
        let redis = try RedisServerProcess()
        let lines = Locked<[String]>([])
        let replica = ReplicaModel(port: redis.port) { level, line in
            if level == .warning { lines.withLock { $0.append(line) } }
        }
        waitUntil(#"replica.link == "connected""#) { replica.link == "connected" }
        let client = try redis.client()
        for _ in 0..<2_000 { client.append(["PUBLISH", "test:changes", "garbage"]) }
        try client.flush()
        for _ in 0..<2_000 { _ = try client.readReply(deadline: monotonicSeconds() + 5) }
        waitUntil(#"replica.store.metricsText().contains("{kind=\"malformed\"} 2000\n")"#) {
            replica.store.metricsText().contains("{kind=\"malformed\"} 2000\n")
        }
        #expect(lines.withLock { $0.filter { $0.contains("did not write") }.count } == 1)
    }
}
