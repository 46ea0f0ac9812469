import RedisTokenStore
import ServerSupport
import Testing

@testable import forge_push_token_server

/// `--redis-url`, `--redis-password-file`, `--redis-key-prefix` (docs/replicas.md).
@Suite struct RedisOptionsTests {
    func parse(
        _ arguments: [String], _ environment: [String: String] = [:],
        files: [String: String] = [:]
    ) throws -> CommandLineOptions {
        try CommandLineOptions.parse(
            arguments, environment: environment,
            readFile: { path in
                guard let text = files[path] else {
                    throw CommandLineOptions.UsageError(description: "No such file or directory")
                }
                return text
            })
    }

    func message(_ arguments: [String], _ environment: [String: String] = [:], files: [String: String] = [:]) -> String
    {
        do {
            _ = try parse(arguments, environment, files: files)
            return "accepted"
        } catch {
            return "\(error)"
        }
    }

    @Test func urlPasswordFileAndPrefix() throws {
        #expect(try parse([]).redis == nil)
        let options = try parse(
            [
                "--redis-url", "redis://u:inurl@10.0.0.5:6380/2", "--redis-password-file", "/run/secrets/r",
                "--redis-key-prefix", "app:tokens",
            ], files: ["/run/secrets/r": "  fromfile\n"])
        #expect(options.redis?.endpoint.address == .tcp(host: "10.0.0.5", port: 6380))
        #expect(options.redis?.endpoint.password == Array("fromfile".utf8))
        #expect(options.redis?.endpoint.user == "u" && options.redis?.endpoint.database == 2)
        #expect(options.redis?.prefix.stateKey == "app:tokens:state")
        let fromEnvironment = try parse(
            [],
            [
                "FORGE_PUSH_TOKEN_REDIS_URL": "unix:///run/redis.sock?db=1",
                "FORGE_PUSH_TOKEN_STATE_FILE": "",
            ])
        #expect(fromEnvironment.redis?.endpoint.address == .unix(path: "/run/redis.sock"))
        #expect(fromEnvironment.redis?.prefix == .standard)
    }

    @Test func refusals() throws {
        #expect(message(["--redis-url", "redis://h", "--state-file", "/s"]).contains("Redis keeps the state"))
        #expect(
            message(["--state-file", "/s"], ["FORGE_PUSH_TOKEN_REDIS_URL": "redis://h"]).contains("exclude each other"))
        #expect(try parse(["--redis-url", "rediss://h"]).redis?.endpoint.tls == true)
        #expect(
            message(["--redis-url", "redis://h", "--redis-tls-ca-file", "/ca"])
                == "--redis-tls-ca-file needs a rediss:// or rediss+sentinel:// --redis-url (TLS to Redis)")
        #expect(
            message(["--redis-url", "redis://h", "--redis-sentinel-password-file", "/s"], files: ["/s": "x"])
                .hasPrefix("--redis-sentinel-password-file needs a redis+sentinel://"))
        let sentinel = try parse(
            ["--redis-url", "redis+sentinel://:pw@s1,s2:26380/mymaster/2", "--redis-sentinel-password-file", "/s"],
            files: ["/s": " sentinel-pw\n"])
        #expect(sentinel.redis?.endpoint.sentinel?.hosts.map(\.description) == ["s1:26379", "s2:26380"])
        #expect(sentinel.redis?.endpoint.sentinel?.password == Array("sentinel-pw".utf8))
        #expect(sentinel.redis?.endpoint.database == 2 && sentinel.redis?.endpoint.tls == false)
        #expect(sentinel.redis?.probeInterval == 5)
        #expect(try parse(["--redis-url", "redis://h", "--redis-probe-interval", "1"]).redis?.probeInterval == 1)
        for bad in ["0", "61", "1.5", "x", ""] where !bad.isEmpty {
            #expect(
                message(["--redis-url", "redis://h", "--redis-probe-interval", bad])
                    == "--redis-probe-interval must be whole seconds from 1 to 60")
        }
        #expect(message(["--redis-probe-interval", "5"]) == "--redis-probe-interval needs --redis-url")
        #expect(message(["--redis-tls-ca-file", "/ca"]) == "--redis-tls-ca-file needs --redis-url")
        #expect(
            message(["--redis-url", "rediss://h", "--redis-tls-cert-file", "/c"]).contains("give both or neither"))
        #expect(
            message(["--redis-url", "rediss://h", "--redis-tls-ca-file", "/missing"]).hasPrefix(
                "--redis-tls-ca-file: cannot read /missing"))
        #expect(
            message(["--redis-url", "rediss://h", "--redis-tls-ca-file", "/ca"], files: ["/ca": "not a PEM\n"])
                .hasPrefix("--redis-tls-ca-file: "))
        let badKey = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----\n"
        let keyMessage = message(
            ["--redis-url", "rediss://h", "--redis-tls-cert-file", "/c", "--redis-tls-key-file", "/k"],
            files: ["/c": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", "/k": badKey])
        #expect(keyMessage.hasPrefix("--redis-tls-cert-file/--redis-tls-key-file: "))
        #expect(!keyMessage.contains("c2VjcmV0") && !keyMessage.contains("BEGIN"))
        #expect(
            message([], ["FORGE_PUSH_TOKEN_REDIS_URL": "redis://h", "FORGE_PUSH_TOKEN_REDIS_TLS_KEY_FILE": "/k"])
                .hasSuffix("(set by FORGE_PUSH_TOKEN_REDIS_TLS_KEY_FILE)"))
        #expect(
            message([], ["FORGE_PUSH_TOKEN_REDIS_URL": "http://h"]).hasSuffix("(set by FORGE_PUSH_TOKEN_REDIS_URL)"))
        #expect(
            message(["--redis-url", "redis://h", "--redis-key-prefix", "a b"]).hasPrefix("--redis-key-prefix must be"))
        #expect(message(["--redis-key-prefix", "x"]) == "--redis-key-prefix needs --redis-url")
        #expect(message(["--redis-password-file", "/p"]) == "--redis-password-file needs --redis-url")
        #expect(
            message(["--redis-url", "redis://h", "--redis-password-file", "/p"], files: ["/p": " \n"]).contains(
                "holds no password"))
        #expect(
            message(["--redis-url", "redis://h", "--redis-password-file", "/missing"]).contains("cannot read /missing"))
        let secret = message(["--redis-url", "redis://u:hunter2@h:99999"])
        #expect(secret.hasPrefix("--redis-url: malformed URL") && !secret.contains("hunter2"))
        #expect(!CommandLineOptions.usage.contains("hunter2") && CommandLineOptions.usage.contains("--redis-url URL"))
    }
}
