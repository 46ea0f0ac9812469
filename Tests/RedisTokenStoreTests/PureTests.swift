import ForgePushTokenOwner
import ServerSupport
import Testing

@testable import RedisTokenStore

/// The `--redis-url` grammar of docs/replicas.md.
@Suite struct RedisEndpointTests {
    @Test func defaultsAndParts() throws {
        let plain = try RedisEndpoint.parse("redis://127.0.0.1")
        #expect(plain == RedisEndpoint(address: .tcp(host: "127.0.0.1", port: 6379)))
        let full = try RedisEndpoint.parse("redis://alice:s%3Acret%40x@redis.example:6380/3")
        #expect(full.address == .tcp(host: "redis.example", port: 6380))
        #expect(full.user == "alice")
        #expect(full.password == Array("s:cret@x".utf8))
        #expect(full.database == 3)
        let passwordOnly = try RedisEndpoint.parse("redis://:p%2Fw@h/")
        #expect(passwordOnly.user == nil && passwordOnly.password == Array("p/w".utf8) && passwordOnly.database == 0)
        let v6 = try RedisEndpoint.parse("redis://[::1]:7000/1")
        #expect(v6.address == .tcp(host: "::1", port: 7000) && v6.database == 1)
        #expect(try RedisEndpoint.parse("REDIS://h:1").address == .tcp(host: "h", port: 1))
    }

    @Test func unixSockets() throws {
        let socket = try RedisEndpoint.parse("unix:///run/redis/redis%20server.sock?db=2")
        #expect(socket.address == .unix(path: "/run/redis/redis server.sock") && socket.database == 2)
        #expect(try RedisEndpoint.parse("unix:///tmp/r.sock").database == 0)
        #expect(throws: RedisEndpoint.ParseError.self) { try RedisEndpoint.parse("unix://relative/r.sock") }
        #expect(throws: RedisEndpoint.ParseError.self) { try RedisEndpoint.parse("unix:///tmp/r.sock?database=1") }
    }

    @Test func tlsURL() throws {
        let tls = try RedisEndpoint.parse("rediss://default:s%40cret@cache.example.com:6380/1")
        #expect(tls.tls && tls.address == .tcp(host: "cache.example.com", port: 6380) && tls.database == 1)
        #expect(tls.user == "default" && tls.password == Array("s@cret".utf8))
        #expect(tls.description == "rediss://default@cache.example.com:6380/1")
        #expect(try RedisEndpoint.parse("rediss://h").address == .tcp(host: "h", port: 6379))
        #expect(try !RedisEndpoint.parse("redis://h").tls)
    }

    @Test func sentinelURLs() throws {
        let plain = try RedisEndpoint.parse("redis+sentinel://u:p%40ss@10.0.0.1,10.0.0.2:26380,[::1]/my-master.1/3")
        #expect(
            plain.sentinel
                == RedisEndpoint.Sentinel(
                    hosts: [
                        .init(host: "10.0.0.1", port: 26379), .init(host: "10.0.0.2", port: 26380),
                        .init(host: "::1", port: 26379),
                    ], masterName: "my-master.1"))
        #expect(plain.user == "u" && plain.password == Array("p@ss".utf8) && plain.database == 3 && !plain.tls)
        #expect(plain.description == "redis+sentinel://u@10.0.0.1:26379,10.0.0.2:26380,[::1]:26379/my-master.1/3")
        let tls = try RedisEndpoint.parse("rediss+sentinel://s1/m")
        #expect(tls.tls && tls.database == 0 && tls.sentinel?.masterName == "m")
        for bad in [
            "redis+sentinel://s1", "redis+sentinel://s1/", "redis+sentinel://s1,/m", "redis+sentinel://s1/m/x",
            "redis+sentinel://s1/bad name", "redis+sentinel://s1:0/m",
            "redis+sentinel://s1/" + String(repeating: "m", count: 65),
        ] {
            #expect(throws: RedisEndpoint.ParseError.self, "\(bad)") { try RedisEndpoint.parse(bad) }
        }
    }

    @Test func refusals() {
        #expect(throws: RedisEndpoint.ParseError.self) { try RedisEndpoint.parse("rediss://h?x=1") }
        #expect(throws: RedisEndpoint.ParseError.unknownScheme("http")) { try RedisEndpoint.parse("http://h") }
        for bad in [
            "redis://", "redis://h:0", "redis://h:65536", "redis://h:x", "redis://h/db", "redis://h/-1",
            "redis://[::1", "redis://[zz]:1", "redis://pw@h", "redis://u:%zz@h", "redis://u:@h",
            "redis://h?x=1", "127.0.0.1:6379", "redis://h h",
        ] {
            #expect(throws: RedisEndpoint.ParseError.self, "\(bad)") { try RedisEndpoint.parse(bad) }
        }
    }

    @Test func messagesNeverContainThePassword() {
        for bad in [
            "redis://u:hunter2@h:99999", "redis://u:hunter2@h/x", "redis://u:hunter2%@h", "redis://u:hunter2@[h",
        ] {
            do {
                _ = try RedisEndpoint.parse(bad)
                Issue.record("accepted \(bad)")
            } catch {
                #expect(!error.description.contains("hunter2"), "\(error)")
            }
        }
        let endpoint = try? RedisEndpoint.parse("redis://u:hunter2@h:1/2")
        #expect(endpoint?.description == "redis://u@h:1/2")
    }

    @Test func keyPrefix() {
        #expect(RedisKeyPrefix("forge-push-token")?.stateKey == "forge-push-token:state")
        #expect(RedisKeyPrefix("a:B_c.d-9")?.changesChannel == "a:B_c.d-9:changes")
        #expect(RedisKeyPrefix(String(repeating: "x", count: 64)) != nil)
        for bad in ["", String(repeating: "x", count: 65), "a b", "a/b", "é", "a*"] {
            #expect(RedisKeyPrefix(bad) == nil, "\(bad)")
        }
    }
}

/// The codec: validation of what is read from Redis (issue 21 §1: no version above 2^53 - 1).
@Suite struct RedisCodecTests {
    @Test func hashFields() throws {
        #expect(try RedisCodec.state(hash: [:]) == nil)
        #expect(try RedisCodec.state(hash: ["version": "7", "token": "ab01"]) == TokenState(version: 7, token: "ab01"))
        #expect(try RedisCodec.state(hash: ["version": "0"]) == TokenState(version: 0, token: nil))
        #expect(
            try RedisCodec.state(hash: ["version": "9007199254740991"])
                == TokenState(version: 9_007_199_254_740_991, token: nil))
        let longest = String(repeating: "ab", count: 256)
        #expect(
            try RedisCodec.state(hash: ["version": "1", "token": longest]) == TokenState(version: 1, token: longest))
        for bad in [
            ["token": "ab"], ["version": "x"], ["version": "-1"], ["version": "1.5"], ["version": ""],
            ["version": "99999999999999999"], ["version": "1", "token": "AB"], ["version": "1", "token": ""],
            ["version": "1", "token": "xyz"], ["version": "9007199254740992"], ["version": "9007199254740993"],
            // Tokens the API could never produce (attack finding): odd length, one digit, over 256 bytes.
            ["version": "1", "token": "abc"], ["version": "1", "token": "0"],
            ["version": "1", "token": String(repeating: "ab", count: 257)],
        ] {
            #expect(throws: RedisCodec.Invalid.self, "\(bad)") { try RedisCodec.state(hash: bad) }
        }
    }

    @Test func changeMessages() throws {
        let state = TokenState(version: 12, token: "00ff")
        let message = RedisCodec.message(state, writer: "1f")
        #expect(message == #"{"version":12,"token":"00ff","writer":"1f"}"#)
        #expect(try RedisCodec.change(message: Array(message.utf8)) == .init(state: state, writer: "1f"))
        let none = TokenState(version: 3, token: nil)
        #expect(RedisCodec.message(none, writer: "2") == #"{"version":3,"token":null,"writer":"2"}"#)
        // A message of a replica of an earlier release names no writer.
        #expect(
            try RedisCodec.change(message: Array(#"{"version":3,"token":null}"#.utf8))
                == .init(state: none, writer: nil))
        #expect(
            try RedisCodec.change(message: Array(#"{"version":9007199254740991,"token":null}"#.utf8)).state.version
                == RedisCodec.maximumVersion)
        for bad in [
            "", "{}", "[1]", #"{"version":-1,"token":null}"#, #"{"version":"1","token":null}"#,
            #"{"version":1,"token":"ZZ"}"#, #"{"version":1,"token":5}"#,
            #"{"version":9007199254740992,"token":null}"#, #"{"version":9007199254740993,"token":"aa"}"#,
            // Valid JSON, but not as a script writes it (attack finding: 1e3 was served, then written
            // back to the hash, which refuses it): exponents, spaces, other key orders, odd tokens.
            #"{"version":1e3,"token":"bbbb"}"#, #"{"version":1000.0,"token":"bbbb"}"#,
            #"{"version": 5,"token":"bbbb"}"#, #"{"token":"bbbb","version":5}"#,
            #"{"version":5,"token":"bbb"}"#, #"{"version":5,"token":"bbbb","writer":"1f","x":1}"#,
        ] {
            #expect(throws: RedisCodec.Invalid.self, "\(bad)") { try RedisCodec.change(message: Array(bad.utf8)) }
        }
    }

    static func reply(_ changed: Int64, _ version: String, _ token: String?, _ reconciled: String, _ previous: String)
        -> RedisReply
    {
        .array([
            .integer(changed), .bulk(Array(version.utf8)), token.map { .bulk(Array($0.utf8)) } ?? .null,
            .bulk(Array(reconciled.utf8)), .bulk(Array(previous.utf8)),
        ])
    }

    @Test func scriptReplies() throws {
        #expect(
            try RedisScripts.parse(Self.reply(1, "5", "abcd", "written", "2"))
                == RedisScripts.Result(
                    state: TokenState(version: 5, token: "abcd"), changed: true, reconciliation: .written,
                    previousVersion: 2))
        let noToken = Self.reply(0, "0", nil, "none", "")
        #expect(try RedisScripts.parse(noToken).state == TokenState(version: 0, token: nil))
        #expect(try RedisScripts.parse(noToken).previousVersion == nil)
        #expect(try RedisScripts.parse(Self.reply(1, "1", "aa", "none", "")).changed)
        for bad: RedisReply in [
            .null, .array([]),
            Self.reply(1, "x", nil, "none", ""),
            Self.reply(1, "1", "AB", "none", ""),
            Self.reply(1, "1", nil, "other", ""),
            Self.reply(2, "1", nil, "none", ""),
            // Versions past 2^53 - 1, in the state or as the previous one.
            Self.reply(0, "9007199254740992", nil, "none", "9007199254740992"),
            Self.reply(0, "1", nil, "none", "9007199254740993"),
            // "Changed", but the version did not go up: never answered as a change.
            Self.reply(1, "7", "aa", "none", "7"),
            Self.reply(1, "6", "aa", "none", "7"),
            Self.reply(1, "0", "aa", "none", ""),
        ] {
            #expect(throws: RedisCodec.Invalid.self, "\(bad)") { try RedisScripts.parse(bad) }
        }
        #expect(RedisScripts.replicaArguments(nil, writer: "w") == ["0", "", "0", "w"])
        #expect(RedisScripts.replicaArguments(TokenState(version: 4, token: nil), writer: "w") == ["4", "", "1", "w"])
    }

    @Test func errorClassification() {
        #expect(
            RedisConnectionError.classify(errorReply: "WRONGPASS invalid username-password pair")
                == .authFailed("WRONGPASS invalid username-password pair"))
        #expect(
            RedisConnectionError.classify(errorReply: "NOAUTH Authentication required.")
                == .authFailed("NOAUTH Authentication required."))
        #expect(
            RedisConnectionError.classify(errorReply: "ERR invalid password") == .authFailed("ERR invalid password"))
        #expect(
            RedisConnectionError.classify(errorReply: "READONLY You can't write against a read only replica.") != nil)
        #expect(RedisConnectionError.classify(errorReply: "LOADING Redis is loading the dataset in memory") != nil)
        #expect(RedisConnectionError.classify(errorReply: "MASTERDOWN Link with MASTER is down") != nil)
        #expect(RedisConnectionError.classify(errorReply: "ERR Error running script") == nil)
        #expect(RedisConnectionError.classify(errorReply: "NOSCRIPT No matching script") == nil)
        #expect(RedisReply.error("NOSCRIPT No matching script").errorCode == "NOSCRIPT")
    }
}

/// The reconnect schedule: about 100 ms, doubling, at most 1 s, jittered.
@Suite struct ReconnectBackoffTests {
    @Test func doublesToTheCapWithJitterInTheUpperHalf() {
        var backoff = ReconnectBackoff()
        var ranges: [ClosedRange<Double>] = []
        let highs = (0..<7).map { _ in
            backoff.next(random: { range in
                ranges.append(range)
                return range.upperBound
            })
        }
        #expect(highs == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0])
        #expect(ranges.map(\.lowerBound) == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5, 0.5])
        backoff.reset()
        #expect(backoff.next(random: { $0.lowerBound }) == 0.05)
        var real = ReconnectBackoff()
        for _ in 0..<20 {
            let delay = real.next()
            #expect(delay >= 0.05 && delay <= 1.0)
        }
    }
}
