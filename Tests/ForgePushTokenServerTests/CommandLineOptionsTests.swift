import Testing
@testable import forge_push_token_server

/// The command line and environment variables of http-api.md, "Command line".
@Suite struct CommandLineOptionsTests {
    func parse(_ arguments: [String], _ environment: [String: String] = [:]) throws -> CommandLineOptions {
        try CommandLineOptions.parse(arguments, environment: environment)
    }

    @Test func defaults() throws {
        let options = try parse([])
        #expect(options.server.host == "127.0.0.1")
        #expect(options.server.port == 8080)
        #expect(options.server.heartbeatSeconds == 15)
        #expect(options.server.maxBodyBytes == 4096)
        #expect(options.server.maxSubscribers == 10_000)
        #expect(options.server.accessLog)
        #expect(options.logLevel == .info)
        #expect(options.action == .run)
    }

    @Test func bothFlagFormsWork() throws {
        let spaced = try parse(["--host", "::1", "--port", "0", "--heartbeat", "2", "--max-body-bytes", "100",
                                "--max-subscribers", "3", "--log-level", "debug", "--access-log", "off"])
        let joined = try parse(["--host=::1", "--port=0", "--heartbeat=2", "--max-body-bytes=100",
                                "--max-subscribers=3", "--log-level=debug", "--access-log=off"])
        #expect(spaced == joined)
        #expect(spaced.server.host == "::1" && spaced.server.port == 0 && spaced.server.heartbeatSeconds == 2)
        #expect(spaced.server.maxBodyBytes == 100 && spaced.server.maxSubscribers == 3)
        #expect(spaced.logLevel == .debug && !spaced.server.accessLog)
    }

    @Test func environmentVariablesConfigureAndFlagsWin() throws {
        let environment = ["FORGE_PUSH_TOKEN_PORT": "9000", "FORGE_PUSH_TOKEN_MAX_BODY_BYTES": "10",
                           "FORGE_PUSH_TOKEN_ACCESS_LOG": "off", "FORGE_PUSH_TOKEN_HOST": "0.0.0.0"]
        let fromEnvironment = try parse([], environment)
        #expect(fromEnvironment.server.port == 9000 && fromEnvironment.server.maxBodyBytes == 10)
        #expect(!fromEnvironment.server.accessLog && fromEnvironment.server.host == "0.0.0.0")
        #expect(try parse(["--port", "9001"], environment).server.port == 9001)
    }

    @Test(arguments: [
        ["--no-such-flag"], ["--port", "notaport"], ["--port", "65536"], ["--port", "-1"], ["--heartbeat=0"],
        ["--heartbeat", "1.5"], ["--max-body-bytes", "0"], ["--max-subscribers", "0"], ["--log-level", "loud"],
        ["--access-log", "yes"], ["--port"], ["stray"], ["--help=1"], ["--host="],
    ])
    func badUsageIsAnError(arguments: [String]) {
        #expect(throws: CommandLineOptions.UsageError.self) { try parse(arguments) }
    }

    @Test func badEnvironmentValueIsAnError() {
        #expect(throws: CommandLineOptions.UsageError.self) { try parse([], ["FORGE_PUSH_TOKEN_PORT": "http"]) }
    }

    @Test func emptyEnvironmentVariablesCountAsUnset() throws {
        let options = try parse([], ["FORGE_PUSH_TOKEN_PORT": "", "FORGE_PUSH_TOKEN_AUTH_TOKEN_FILE": "",
                                     "FORGE_PUSH_TOKEN_CORS_ORIGIN": "", "FORGE_PUSH_TOKEN_TLS_CERT": ""])
        #expect(options == (try parse([])))
        #expect(throws: CommandLineOptions.UsageError.self) { try parse(["--auth-token-file", ""]) }
    }

    @Test func helpVersionAndHealthCheck() throws {
        #expect(try parse(["--help"]).action == .help)
        #expect(try parse(["--version"]).action == .version)
        #expect(try parse(["--health-check", "--port", "9"]).action == .healthCheck)
        #expect(CommandLineOptions.usage.contains("--max-subscribers"))
    }
}

/// `--redis-url`, `--redis-password-file`, `--redis-key-prefix` (docs/replicas.md).
@Suite struct RedisOptionsTests {
    func parse(_ arguments: [String], _ environment: [String: String] = [:],
               files: [String: String] = [:]) throws -> CommandLineOptions {
        try CommandLineOptions.parse(arguments, environment: environment, readFile: { path in
            guard let text = files[path] else { throw CommandLineOptions.UsageError(description: "No such file or directory") }
            return text
        })
    }

    func message(_ arguments: [String], _ environment: [String: String] = [:], files: [String: String] = [:]) -> String {
        do {
            _ = try parse(arguments, environment, files: files)
            return "accepted"
        } catch {
            return "\(error)"
        }
    }

    @Test func urlPasswordFileAndPrefix() throws {
        #expect(try parse([]).redis == nil)
        let options = try parse(["--redis-url", "redis://u:inurl@10.0.0.5:6380/2", "--redis-password-file", "/run/secrets/r",
                                 "--redis-key-prefix", "app:tokens"], files: ["/run/secrets/r": "  fromfile\n"])
        #expect(options.redis?.endpoint.address == .tcp(host: "10.0.0.5", port: 6380))
        #expect(options.redis?.endpoint.password == Array("fromfile".utf8))
        #expect(options.redis?.endpoint.user == "u" && options.redis?.endpoint.database == 2)
        #expect(options.redis?.prefix.stateKey == "app:tokens:state")
        let fromEnvironment = try parse([], ["FORGE_PUSH_TOKEN_REDIS_URL": "unix:///run/redis.sock?db=1",
                                             "FORGE_PUSH_TOKEN_STATE_FILE": ""])
        #expect(fromEnvironment.redis?.endpoint.address == .unix(path: "/run/redis.sock"))
        #expect(fromEnvironment.redis?.prefix == .standard)
    }

    @Test func refusals() {
        #expect(message(["--redis-url", "redis://h", "--state-file", "/s"]).contains("Redis keeps the state"))
        #expect(message(["--state-file", "/s"], ["FORGE_PUSH_TOKEN_REDIS_URL": "redis://h"]).contains("exclude each other"))
        #expect(message(["--redis-url", "rediss://h"]).hasPrefix("--redis-url: rediss:// (TLS) is not supported"))
        #expect(message(["--redis-url", "rediss://h"]).contains("tunnel"))
        #expect(message([], ["FORGE_PUSH_TOKEN_REDIS_URL": "http://h"]).hasSuffix("(set by FORGE_PUSH_TOKEN_REDIS_URL)"))
        #expect(message(["--redis-url", "redis://h", "--redis-key-prefix", "a b"]).hasPrefix("--redis-key-prefix must be"))
        #expect(message(["--redis-key-prefix", "x"]) == "--redis-key-prefix needs --redis-url")
        #expect(message(["--redis-password-file", "/p"]) == "--redis-password-file needs --redis-url")
        #expect(message(["--redis-url", "redis://h", "--redis-password-file", "/p"], files: ["/p": " \n"]).contains("holds no password"))
        #expect(message(["--redis-url", "redis://h", "--redis-password-file", "/missing"]).contains("cannot read /missing"))
        let secret = message(["--redis-url", "redis://u:hunter2@h:99999"])
        #expect(secret.hasPrefix("--redis-url: malformed URL") && !secret.contains("hunter2"))
        #expect(!CommandLineOptions.usage.contains("hunter2") && CommandLineOptions.usage.contains("--redis-url URL"))
    }
}
