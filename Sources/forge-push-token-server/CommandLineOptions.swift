import ForgePushToken
import MicroHTTPDServer

/// The command line and `FORGE_PUSH_TOKEN_*` environment variables of the service
/// (http-api.md, "Command line"). A flag wins over its variable.
struct CommandLineOptions: Equatable {
    var server = ServerConfiguration()
    var logLevel: PushTokenManager.LogLevel = .info
    /// `--state-file PATH`: where the token and its version survive restarts; `nil` for none.
    var stateFile: String?
    var action: Action = .run

    enum Action: Equatable { case run, help, version, healthCheck }

    /// A usage error: the message printed before the usage text (exit 64).
    struct UsageError: Error, Equatable, CustomStringConvertible {
        let description: String
    }

    static let usage = """
        usage: forge-push-token-server [--host ADDR] [--port N] [--heartbeat SECONDS]
                                       [--max-body-bytes N] [--max-subscribers N]
                                       [--log-level debug|info|warning|error] [--access-log on|off]
                                       [--state-file PATH]
                                       [--version] [--help] [--health-check]

          --host ADDR             IPv4 or IPv6 literal, or localhost (default 127.0.0.1)
          --port N                TCP port, 0 picks a free one (default 8080)
          --heartbeat SECONDS     keep-alive comment interval on idle streams, >= 1 (default 15)
          --max-body-bytes N      largest request body in bytes (default 4096)
          --max-subscribers N     most event-stream subscribers at once (default 10000)
          --log-level LEVEL       debug, info, warning or error (default info)
          --access-log on|off     one log line per request (default on)
          --state-file PATH       keep the token and its version in PATH across restarts (written
                                  durably before each change is answered; default: none)
          --version               print the version and exit
          --help                  print this help and exit
          --health-check          ask GET /healthz of the service at --host/--port (a wildcard
                                  host means loopback); exit 0 when it answers 200, else 1

        Every flag has an environment variable: FORGE_PUSH_TOKEN_ and the flag in upper case with
        - as _ (FORGE_PUSH_TOKEN_PORT=9000). A flag wins over its variable.
        """

    /// The flags that take a value, in the order of the usage text.
    static let valueFlags = ["host", "port", "heartbeat", "max-body-bytes", "max-subscribers", "log-level", "access-log",
                             "state-file"]

    /// Parses `arguments` (without the program name) over `environment`.
    static func parse(_ arguments: [String], environment: [String: String]) throws(UsageError) -> CommandLineOptions {
        var values: [String: String] = [:]
        for flag in valueFlags {
            let variable = "FORGE_PUSH_TOKEN_" + String(flag.uppercased().map { $0 == "-" ? "_" : $0 })
            if let value = environment[variable] { values[flag] = value }
        }
        var options = CommandLineOptions()
        var index = 0
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            guard argument.hasPrefix("--") else { throw UsageError(description: "unexpected argument \(argument)") }
            var name = String(argument.dropFirst(2))
            var inline: String?
            if let equals = name.firstIndex(of: "=") {
                inline = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            switch name {
            case "help", "version", "health-check":
                guard inline == nil else { throw UsageError(description: "--\(name) takes no value") }
                if options.action == .run {
                    options.action = name == "help" ? .help : name == "version" ? .version : .healthCheck
                }
            case _ where valueFlags.contains(name):
                if let inline {
                    values[name] = inline
                } else {
                    guard index < arguments.count else { throw UsageError(description: "--\(name) needs a value") }
                    values[name] = arguments[index]
                    index += 1
                }
            default:
                throw UsageError(description: "unknown option \(argument)")
            }
        }
        try options.apply(values)
        return options
    }

    private mutating func apply(_ values: [String: String]) throws(UsageError) {
        if let host = values["host"] {
            guard !host.isEmpty else { throw UsageError(description: "--host needs an address") }
            server.host = host
        }
        if let port = values["port"] {
            guard let number = UInt16(port) else {
                throw UsageError(description: "--port must be a whole number from 0 to 65535, not \(port)")
            }
            server.port = number
        }
        if let seconds = values["heartbeat"] {
            server.heartbeatSeconds = try Self.whole(seconds, flag: "heartbeat", in: 1...86_400, unit: "seconds")
        }
        if let bytes = values["max-body-bytes"] {
            server.maxBodyBytes = try Self.whole(bytes, flag: "max-body-bytes", in: 1...(64 << 20), unit: "bytes")
        }
        if let count = values["max-subscribers"] {
            server.maxSubscribers = try Self.whole(count, flag: "max-subscribers", in: 1...1_000_000, unit: "subscribers")
        }
        if let level = values["log-level"] {
            guard let parsed = PushTokenManager.LogLevel(rawValue: level) else {
                throw UsageError(description: "--log-level must be debug, info, warning or error, not \(level)")
            }
            logLevel = parsed
        }
        if let path = values["state-file"] {
            guard !path.isEmpty else { throw UsageError(description: "--state-file needs a path") }
            stateFile = path
        }
        if let access = values["access-log"] {
            switch access {
            case "on": server.accessLog = true
            case "off": server.accessLog = false
            default: throw UsageError(description: "--access-log must be on or off, not \(access)")
            }
        }
    }

    private static func whole(_ text: String, flag: String, in range: ClosedRange<Int>, unit: String) throws(UsageError) -> Int {
        guard let value = Int(text), range.contains(value) else {
            throw UsageError(description: "--\(flag) must be a whole number of \(unit) from \(range.lowerBound) to \(range.upperBound), not \(text)")
        }
        return value
    }
}
