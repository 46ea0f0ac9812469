import ForgePushToken
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing
import TokenService

@testable import forge_push_token_server

/// The hardening flags of issue 5: authentication, TLS, CORS and limits.
@Suite struct HardeningOptionsTests {
    static let token = "Zm9yZ2UtcHVzaC10b2tlbi1zZWNyZXQ"

    /// Files a test pretends exist: path → content; any other path fails as a missing file does.
    func parse(
        _ arguments: [String], _ environment: [String: String] = [:],
        files: [String: String] = [:]
    ) throws -> CommandLineOptions {
        try CommandLineOptions.parse(arguments, environment: environment) { path in
            guard let text = files[path] else {
                throw CommandLineOptions.UsageError(description: "No such file or directory")
            }
            return text
        }
    }

    func usageError(
        _ arguments: [String], _ environment: [String: String] = [:],
        files: [String: String] = [:]
    ) -> String? {
        do {
            _ = try parse(arguments, environment, files: files)
            return nil
        } catch {
            return "\(error)"
        }
    }

    @Test func defaultsAreOpenPlainAndBounded() throws {
        let options = try parse([])
        #expect(options.authToken == nil && options.authentication == nil && options.authScope == .writes)
        #expect(options.server.tls == nil && options.crossOrigin.origins.isEmpty)
        #expect(options.server.connectionLimit == 10_000 + 1024 && options.server.maxConnectionsPerAddress == 0)
        #expect(options.server.maxHeaderBytes == 36320 && options.server.connectionMemoryLimit == 40960)
        #expect(options.server.maxURLBytes == 2048)
        #expect(options.server.idleTimeoutSeconds == 60)
        #expect(options.startupWarnings.isEmpty)
    }

    @Test func authTokenFromFlagVariableOrFile() throws {
        #expect(try parse(["--auth-token", Self.token]).authToken == Self.token)
        #expect(try parse([], ["FORGE_PUSH_TOKEN_AUTH_TOKEN": Self.token]).authToken == Self.token)
        let fromFile = try parse(
            ["--auth-token-file=/run/secrets/token"], files: ["/run/secrets/token": " \(Self.token)\n"])
        #expect(fromFile.authToken == Self.token)
        let scoped = try parse(["--auth-token", Self.token, "--auth-scope", "all"])
        #expect(scoped.authentication?.scope == .all)
        #expect(scoped.authentication?.protects(.token) == true)
    }

    @Test("bad authentication options are usage errors that never show the token")
    func badAuthentication() throws {
        let secret = "not a valid token"
        let cases: [([String], [String: String], String)] = [
            (["--auth-token", secret], [:], "may hold only"),
            (["--auth-token", ""], [:], "empty"),
            (["--auth-token", Self.token, "--auth-token-file", "/t"], [:], "exclude each other"),
            (["--auth-token-file", "/missing"], [:], "cannot read /missing: No such file"),
            (["--auth-token-file", "/blank"], [:], "empty"),
            (["--auth-scope", "all"], [:], "needs --auth-token"),
            (["--auth-token", Self.token, "--auth-scope", "some"], [:], "writes or all"),
            ([], ["FORGE_PUSH_TOKEN_AUTH_TOKEN": secret], "may hold only"),
        ]
        for (arguments, environment, expected) in cases {
            let message = try #require(
                usageError(arguments, environment, files: ["/t": Self.token, "/blank": "\n"]),
                "\(arguments) should fail")
            #expect(message.contains(expected), "\(message)")
            #expect(!message.contains(secret) && !message.contains(Self.token), "\(message)")
        }
    }

    @Test func startupWarnings() throws {
        let open = try parse(["--host", "0.0.0.0"]).startupWarnings
        #expect(open.count == 1 && open[0].contains("without --auth-token"))
        let short = try parse(["--auth-token", "abc123"]).startupWarnings
        #expect(short.count == 1 && short[0].contains("only 6 characters") && !short[0].contains("abc123"))
        #expect(try parse(["--host", "::", "--auth-token", Self.token]).startupWarnings.isEmpty)
        #expect(try parse(["--host", "127.0.0.2"]).startupWarnings.isEmpty)
        // A misspelt variable is named (never its value); the known ones are not.
        let misspelt = try parse(
            [],
            [
                "FORGE_PUSH_TOKEN_AUTH_TOKEN_FLIE": "/run/secret", "FORGE_PUSH_TOKEN_PORT": "9000",
                "OTHER": "x",
            ]
        ).startupWarnings
        #expect(
            misspelt == ["FORGE_PUSH_TOKEN_AUTH_TOKEN_FLIE is not a setting of this service and is ignored (misspelt?)"]
        )
    }

    @Test func tlsNeedsBothFilesAndReadsThem() throws {
        let files = ["/c.pem": "-----BEGIN CERTIFICATE-----\n", "/k.pem": "-----BEGIN PRIVATE KEY-----\n"]
        let options = try parse(["--tls-cert", "/c.pem", "--tls-key=/k.pem"], files: files)
        #expect(options.server.tls == TLSCredentials(certificatePEM: files["/c.pem"]!, privateKeyPEM: files["/k.pem"]!))
        #expect(!"\(options.server.tls!)".contains("PRIVATE"))
        #expect(usageError(["--tls-cert", "/c.pem"], files: files)?.contains("needs --tls-key") == true)
        #expect(usageError(["--tls-key", "/k.pem"], files: files)?.contains("needs --tls-cert") == true)
        #expect(
            usageError(["--tls-cert", "/c.pem", "--tls-key", "/nope"], files: files)?.contains("cannot read /nope")
                == true)
    }

    @Test func corsOriginsRepeatAndTheVariableTakesAList() throws {
        #expect(
            try parse(["--cors-origin", "https://a.example", "--cors-origin=http://localhost:3000"]).crossOrigin.origins
                == ["https://a.example", "http://localhost:3000"])
        let environment = ["FORGE_PUSH_TOKEN_CORS_ORIGIN": "https://a.example, https://b.example"]
        #expect(try parse([], environment).crossOrigin.origins == ["https://a.example", "https://b.example"])
        #expect(try parse(["--cors-origin", "*"], environment).crossOrigin.origins == ["*"])
        #expect(usageError(["--cors-origin", "https://a.example/"])?.contains("is not an origin") == true)
    }

    @Test func limits() throws {
        let options = try parse([
            "--max-connections", "50", "--max-connections-per-ip", "4", "--max-header-bytes", "15184",
            "--max-url-bytes", "512", "--idle-timeout", "5",
        ])
        #expect(options.server.connectionLimit == 50 && options.server.maxConnectionsPerAddress == 4)
        #expect(options.server.maxHeaderBytes == 15184 && options.server.connectionMemoryLimit == 16368)
        let largest = try parse(["--max-header-bytes", "59360"])
        #expect(largest.server.maxHeaderBytes == 59360 && largest.server.connectionMemoryLimit == 65536)
        #expect(options.server.maxURLBytes == 512)
        #expect(options.server.idleTimeoutSeconds == 5)
        #expect(try parse([]).server.headerTimeoutSeconds == 10)
        #expect(try parse(["--header-timeout", "3"]).server.headerTimeoutSeconds == 3)
        let environment = [
            "FORGE_PUSH_TOKEN_MAX_CONNECTIONS_PER_IP": "2", "FORGE_PUSH_TOKEN_IDLE_TIMEOUT": "9",
            "FORGE_PUSH_TOKEN_HEADER_TIMEOUT": "7",
        ]
        let fromEnvironment = try parse([], environment)
        #expect(fromEnvironment.server.maxConnectionsPerAddress == 2 && fromEnvironment.server.idleTimeoutSeconds == 9)
        #expect(fromEnvironment.server.headerTimeoutSeconds == 7)
        for (flag, value) in [
            ("max-connections", "0"), ("max-connections-per-ip", "-1"), ("max-header-bytes", "2047"),
            ("max-header-bytes", "59361"),
            ("max-url-bytes", "8"), ("idle-timeout", "0"), ("max-connections", "many"),
            ("header-timeout", "0"), ("header-timeout", "3601"),
        ] {
            let message = usageError(["--\(flag)", value])
            #expect(
                message?.contains("--\(flag) must be a whole number") == true,
                "\(flag) \(value): \(message ?? "accepted")")
        }
    }

    @Test("hosts, ports and origins are checked at parse time; an unknown flag's value is not echoed")
    func strictValues() {
        #expect(usageError(["--host", "999.1.1.1"])?.contains("IPv4 or IPv6 literal") == true)
        #expect(usageError(["--host", "example.com"]) != nil)
        #expect(usageError(["--host", "[::1]"]) == nil && usageError(["--host", "::"]) == nil)
        #expect(usageError(["--port", "+80"]) != nil)
        #expect(usageError(["--max-connections", "+5"]) != nil)
        #expect(usageError(["--cors-origin", "https://a.example:99999"]) != nil)
        #expect(usageError(["--cors-origin", "https://a.example:65535"]) == nil)
        let message = usageError(["--auth-tokn=SECRETVALUE"])
        #expect(message == "unknown option --auth-tokn")
    }

    @Test("a token flag wins over the other token variable; a bad variable is named in the error")
    func flagsWinAndVariablesAreNamed() throws {
        let options = try parse(
            ["--auth-token", Self.token], ["FORGE_PUSH_TOKEN_AUTH_TOKEN_FILE": "/t"], files: ["/t": "other"])
        #expect(options.authToken == Self.token)
        let fromFile = try parse(
            ["--auth-token-file", "/t"], ["FORGE_PUSH_TOKEN_AUTH_TOKEN": Self.token],
            files: ["/t": "fromfile"])
        #expect(fromFile.authToken == "fromfile")
        #expect(
            usageError([], ["FORGE_PUSH_TOKEN_ACCESS_LOG": "true"])
                == "--access-log must be on or off, not true (set by FORGE_PUSH_TOKEN_ACCESS_LOG)")
        #expect(usageError(["--access-log", "true"]) == "--access-log must be on or off, not true")
    }

    @Test func usageListsEveryFlag() {
        let synopsis = CommandLineOptions.usage.split(separator: "\n\n")[0]
        for flag in CommandLineFlag.allCases {
            // In the synopsis, and its own entry: the flag (and its argument) at column 2.
            #expect(
                ["\(flag) ", "\(flag)]", "\(flag)["].contains { synopsis.contains($0) },
                "\(flag) is missing from the synopsis")
            let entry = "\n  " + (flag.argument.map { "\(flag) \($0)" } ?? "\(flag)")
            #expect(CommandLineOptions.usage.contains(entry), "\(flag) has no entry in the usage text")
            #expect(!flag.help.isEmpty && flag.help.allSatisfy { !$0.isEmpty })
        }
        #expect(CommandLineOptions.valueFlags.count == CommandLineFlag.allCases.count - 3)
    }

    @Test("each flag's variable: FORGE_PUSH_TOKEN_ and the name in upper case, - as _")
    func variables() {
        #expect(CommandLineFlag.maxConnectionsPerIP.variable == "FORGE_PUSH_TOKEN_MAX_CONNECTIONS_PER_IP")
        #expect(CommandLineFlag.redisTLSCAFile.description == "--redis-tls-ca-file")
        #expect(Set(CommandLineFlag.allCases.map(\.variable)).count == CommandLineFlag.allCases.count)
    }
}
