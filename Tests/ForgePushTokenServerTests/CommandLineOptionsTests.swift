import ForgePushToken
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing
import TokenService

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
        #expect(options.accessLog)
        #expect(options.logLevel == .info)
        #expect(options.action == .run)
    }

    @Test func bothFlagFormsWork() throws {
        let spaced = try parse([
            "--host", "::1", "--port", "0", "--heartbeat", "2", "--max-body-bytes", "100",
            "--max-subscribers", "3", "--log-level", "debug", "--access-log", "off",
        ])
        let joined = try parse([
            "--host=::1", "--port=0", "--heartbeat=2", "--max-body-bytes=100",
            "--max-subscribers=3", "--log-level=debug", "--access-log=off",
        ])
        #expect(spaced == joined)
        #expect(spaced.server.host == "::1" && spaced.server.port == 0 && spaced.server.heartbeatSeconds == 2)
        #expect(spaced.server.maxBodyBytes == 100 && spaced.server.maxSubscribers == 3)
        #expect(spaced.logLevel == .debug && !spaced.accessLog)
    }

    @Test func environmentVariablesConfigureAndFlagsWin() throws {
        let environment = [
            "FORGE_PUSH_TOKEN_PORT": "9000", "FORGE_PUSH_TOKEN_MAX_BODY_BYTES": "10",
            "FORGE_PUSH_TOKEN_ACCESS_LOG": "off", "FORGE_PUSH_TOKEN_HOST": "0.0.0.0",
        ]
        let fromEnvironment = try parse([], environment)
        #expect(fromEnvironment.server.port == 9000 && fromEnvironment.server.maxBodyBytes == 10)
        #expect(!fromEnvironment.accessLog && fromEnvironment.server.host == "0.0.0.0")
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
        let options = try parse(
            [],
            [
                "FORGE_PUSH_TOKEN_PORT": "", "FORGE_PUSH_TOKEN_AUTH_TOKEN_FILE": "",
                "FORGE_PUSH_TOKEN_CORS_ORIGIN": "", "FORGE_PUSH_TOKEN_TLS_CERT": "",
            ])
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

/// `--log-format text|json` and `FORGE_PUSH_TOKEN_LOG_FORMAT` (issue 13).
@Suite struct LogFormatOptionsTests {
    @Test func logFormatFlagAndVariable() throws {
        #expect(try CommandLineOptions.parse([], environment: [:]).logFormat == .text)
        #expect(try CommandLineOptions.parse(["--log-format", "json"], environment: [:]).logFormat == .json)
        #expect(try CommandLineOptions.parse(["--log-format=text"], environment: [:]).logFormat == .text)
        let environment = ["FORGE_PUSH_TOKEN_LOG_FORMAT": "json"]
        #expect(try CommandLineOptions.parse([], environment: environment).logFormat == .json)
        #expect(try CommandLineOptions.parse(["--log-format", "text"], environment: environment).logFormat == .text)
        #expect(try CommandLineOptions.parse([], environment: ["FORGE_PUSH_TOKEN_LOG_FORMAT": ""]).logFormat == .text)
        #expect(CommandLineOptions.usage.contains("--log-format text|json"))
    }

    @Test func badLogFormatIsAUsageError() {
        for (arguments, environment, expected) in [
            (["--log-format", "JSON"], [:], "--log-format must be text or json, not JSON"),
            (["--log-format", "logfmt"], [:], "--log-format must be text or json, not logfmt"),
            ([], ["FORGE_PUSH_TOKEN_LOG_FORMAT": "yaml"], "(set by FORGE_PUSH_TOKEN_LOG_FORMAT)"),
        ] as [([String], [String: String], String)] {
            do {
                _ = try CommandLineOptions.parse(arguments, environment: environment)
                Issue.record("\(arguments) \(environment) was accepted")
            } catch {
                #expect(error.description.contains(expected), "\(error.description)")
            }
        }
    }
}

extension LogFormatOptionsTests {
    @Test func requestedLogFormatIsFoundEvenWhenOtherOptionsDoNotParse() {
        #expect(
            CommandLineOptions.requestedLogFormat(["--port", "x", "--log-format", "json"], environment: [:]) == .json)
        #expect(CommandLineOptions.requestedLogFormat(["--log-format=json", "--bogus"], environment: [:]) == .json)
        #expect(
            CommandLineOptions.requestedLogFormat(["--bogus"], environment: ["FORGE_PUSH_TOKEN_LOG_FORMAT": "json"])
                == .json)
        #expect(
            CommandLineOptions.requestedLogFormat(
                ["--log-format", "text"], environment: ["FORGE_PUSH_TOKEN_LOG_FORMAT": "json"]) == .text)
        #expect(CommandLineOptions.requestedLogFormat(["--log-format"], environment: [:]) == .text)
        #expect(CommandLineOptions.requestedLogFormat([], environment: [:]) == .text)
    }
}
