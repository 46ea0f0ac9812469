import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import MicroHTTPDServer
import RedisTokenStore
import ServerSupport
import TokenService

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The command line and `FORGE_PUSH_TOKEN_*` environment variables of the service
/// (docs/operations.md, "Command line"; the flags themselves: `CommandLineFlag`). A flag wins over
/// its variable.
struct CommandLineOptions: Equatable {
    var server = ServerConfiguration()
    var logLevel: ServerLogLevel = .info
    /// `--log-format text|json`.
    var logFormat: ServerLog.Format = .text
    /// `--state-file PATH`: where the token and its version survive restarts; `nil` for none.
    var stateFile: String?
    /// `--auth-token` or the content of `--auth-token-file`: the bearer token writers (or, with
    /// scope `all`, every client but the probes `/healthz`, `/livez` and `/readyz`) must send; `nil` for an open service.
    var authToken: String?
    /// `--auth-scope writes|all`.
    var authScope: BearerAuthentication.Scope = .writes
    /// `--write-token-file PATH` (docs/operations.md, "Read and write tokens"): the tokens that
    /// may write and read, read again on `SIGHUP` and when the file changes
    /// (`CredentialReloader`); `nil` without one.
    var writeTokenFile: String?
    /// `--read-token-file PATH`: the tokens that may only read; needs `writeTokenFile`.
    var readTokenFile: String?
    /// The tokens of `writeTokenFile` and `readTokenFile` as read at start (`TokenFile.parse`).
    var writeTokens: [String]?
    var readTokens: [String]?
    /// What `stat(2)` said of the token files just before they were read at start (write, then
    /// read): the reloader's starting point, so that a change while they were read is not missed.
    var tokenFileSignatures: [CredentialReloader.Signature] = []
    /// `--cors-origin`, validated, in order (`*` allows every origin).
    var crossOrigin = CrossOriginPolicy()
    /// `--access-log on|off`: one log line per finished request (the responder writes it).
    var accessLog = true
    var action: Action = .run
    /// `--drain-seconds N`: how long a stopping service spends ending its event streams, 0 to 600
    /// (docs/operations.md, "Draining"; default 0: at once).
    var drainSeconds = 0
    /// `--max-stream-age SECONDS`: each stream's age limit A (each draws from [A/2, A]); 0 (the
    /// default) for none, else 60 to 86,400 (docs/operations.md, "Stream age").
    var maxStreamAge = 0
    /// What `--health-check` asks (`--health-check=live` or `=ready`; default `/healthz`).
    var healthCheckProbe: HealthCheck.Probe = .health
    /// `FORGE_PUSH_TOKEN_*` variables that name no setting (a misspelling would otherwise go
    /// unnoticed: a mistyped `..._AUTH_TOKEN_FILE` leaves the service open), sorted.
    var unknownVariables: [String] = []
    /// `--redis-url` with `--redis-password-file` and `--redis-key-prefix`: run as one replica
    /// of several sharing the token through Redis (docs/replicas.md); `nil` to run alone.
    var redis: RedisTokenStore.Configuration?

    enum Action: Equatable { case run, help, version, healthCheck }

    /// A usage error: the message printed before the usage text (exit 64).
    struct UsageError: Error, Equatable, CustomStringConvertible {
        let description: String
    }

    /// The flags, as `CommandLineFlag` (the one place each is named).
    typealias Flag = CommandLineFlag

    /// The help text: the synopsis, every flag's entry (`CommandLineFlag.usageEntry`) and the
    /// environment variables.
    static let usage = """
        usage: forge-push-token-server [\(Flag.host) ADDR] [\(Flag.port) N] [\(Flag.heartbeat) SECONDS]
                                       [\(Flag.maxBodyBytes) N] [\(Flag.maxSubscribers) N]
                                       [\(Flag.logLevel) debug|info|warning|error] [\(Flag.accessLog) on|off]
                                       [\(Flag.logFormat) text|json]
                                       [\(Flag.stateFile) PATH]
                                       [\(Flag.authToken) TOKEN | \(Flag.authTokenFile) PATH] [\(Flag.authScope) writes|all]
                                       [\(Flag.writeTokenFile) PATH [\(Flag.readTokenFile) PATH]]
                                       [\(Flag.tlsCert) PATH \(Flag.tlsKey) PATH] [\(Flag.corsOrigin) ORIGIN ...]
                                       [\(Flag.maxConnections) N] [\(Flag.maxConnectionsPerIP) N]
                                       [\(Flag.maxHeaderBytes) N] [\(Flag.maxURLBytes) N] [\(Flag.idleTimeout) SECONDS]
                                       [\(Flag.headerTimeout) SECONDS]
                                       [\(Flag.redisURL) URL [\(Flag.redisPasswordFile) PATH] [\(Flag.redisKeyPrefix) PREFIX]
                                        [\(Flag.redisTLSCAFile) PATH] [\(Flag.redisTLSCertFile) PATH \(Flag.redisTLSKeyFile) PATH]
                                        [\(Flag.redisSentinelPasswordFile) PATH] [\(Flag.redisProbeInterval) SECONDS]]
                                       [\(Flag.drainSeconds) N] [\(Flag.maxStreamAge) SECONDS]
                                       [\(Flag.version)] [\(Flag.help)] [\(Flag.healthCheck)[=live|ready]]

        \(Flag.allCases.map(\.usageEntry).joined(separator: "\n"))

        Every flag has an environment variable: FORGE_PUSH_TOKEN_ and the flag in upper case with
        - as _ (FORGE_PUSH_TOKEN_PORT=9000). A flag wins over its variable; an empty variable counts
        as unset. The variable of a repeatable flag takes a comma-separated list
        (FORGE_PUSH_TOKEN_CORS_ORIGIN=https://a,https://b).
        """

    /// The flags that take a value, in the order of the usage text.
    static let valueFlags = Flag.allCases.filter(\.takesValue)
    /// The value flags that may be given more than once; their values accumulate.
    static let repeatableFlags: Set = [Flag.corsOrigin]

    /// Parses `arguments` (without the program name) over `environment`.
    /// - Parameter readFile: reads a file named by a flag (`--auth-token-file`, `--tls-cert`,
    ///   `--tls-key`) as UTF-8 text; its error's description goes into the usage error.
    static func parse(
        _ arguments: [String], environment: [String: String],
        readFile: (String) throws -> String = Self.readTextFile
    ) throws(UsageError) -> CommandLineOptions {
        var values: [Flag: String] = [:]
        var lists: [Flag: [String]] = [:]
        for flag in valueFlags {
            let variable = flag.variable
            // An empty variable counts as unset, so that Compose's "${VAR:-}" can leave a setting out.
            guard let value = environment[variable], !value.isEmpty else { continue }
            if repeatableFlags.contains(flag) {
                lists[flag] = value.split(separator: ",").map { String($0.trimmingASCIIWhitespace()) }.filter {
                    !$0.isEmpty
                }
            } else {
                values[flag] = value
            }
        }
        var listsFromFlags: Set<Flag> = []
        let fromEnvironment = Set(values.keys).union(lists.keys)
        var fromFlags: Set<Flag> = []
        var options = CommandLineOptions()
        let known = Set(valueFlags.map(\.variable))
        options.unknownVariables = environment.keys.filter { $0.hasPrefix("FORGE_PUSH_TOKEN_") && !known.contains($0) }
            .sorted()
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
            // The name alone: the value of a mistyped flag may be a secret (--auth-tokn=...).
            guard let flag = Flag(rawValue: name) else { throw UsageError(description: "unknown option --\(name)") }
            switch flag {
            case .healthCheck where inline != nil:
                // An optional value: the = form only (docs/operations.md, "Probes").
                guard let probe = HealthCheck.Probe(flagValue: inline ?? "") else {
                    throw UsageError(description: "\(Flag.healthCheck) takes live or ready, not \(inline ?? "")")
                }
                options.healthCheckProbe = probe
                if options.action == .run { options.action = .healthCheck }
            case .help, .version, .healthCheck:
                guard inline == nil else { throw UsageError(description: "\(flag) takes no value") }
                if options.action == .run {
                    options.action = flag == .help ? .help : flag == .version ? .version : .healthCheck
                }
            default:
                let value: String
                if let inline {
                    value = inline
                } else {
                    guard index < arguments.count else { throw UsageError(description: "\(flag) needs a value") }
                    value = arguments[index]
                    index += 1
                }
                fromFlags.insert(flag)
                if repeatableFlags.contains(flag) {
                    // Flags replace the variable's list, then accumulate.
                    if listsFromFlags.insert(flag).inserted { lists[flag] = [] }
                    lists[flag, default: []].append(value)
                } else {
                    values[flag] = value
                }
            }
        }
        // --auth-token and --auth-token-file exclude each other, but a flag still wins over the
        // other one's variable.
        for (flag, other) in [(Flag.authToken, Flag.authTokenFile), (.authTokenFile, .authToken)]
        where fromFlags.contains(flag) && !fromFlags.contains(other) {
            values[other] = nil
        }
        do throws(UsageError) {
            try options.apply(values)
            try options.applySecurity(values, lists: lists, readFile: readFile)
            try options.applyRedis(values, readFile: readFile)
        } catch {
            // Name the variable when the value came from one: in a container, nobody typed a flag.
            for flag in fromEnvironment.subtracting(fromFlags).sorted(by: { $0.rawValue < $1.rawValue })
            where error.description.hasPrefix("\(flag) ") || error.description.hasPrefix("\(flag):") {
                throw UsageError(description: error.description + " (set by \(flag.variable))")
            }
            throw error
        }
        return options
    }

    /// The log format `arguments` and `environment` ask for, found without parsing the rest (for
    /// the usage error of options that do not parse): the last `--log-format json` or
    /// `--log-format=json`, else `FORGE_PUSH_TOKEN_LOG_FORMAT`; `.text` otherwise.
    static func requestedLogFormat(_ arguments: [String], environment: [String: String]) -> ServerLog.Format {
        var format = environment[Flag.logFormat.variable].flatMap(ServerLog.Format.init(rawValue:)) ?? .text
        for (index, argument) in arguments.enumerated() {
            if argument.hasPrefix("\(Flag.logFormat)=") {
                format = ServerLog.Format(rawValue: String(argument.dropFirst("\(Flag.logFormat)=".count))) ?? format
            } else if argument == "\(Flag.logFormat)", index + 1 < arguments.count {
                format = ServerLog.Format(rawValue: arguments[index + 1]) ?? format
            }
        }
        return format
    }

    /// Reads `path` (at most 1 MiB) as UTF-8 text; the error says why not, as `strerror(3)` does.
    static func readTextFile(_ path: String) throws -> String {
        let bytes: [UInt8]
        do {
            bytes = try SmallFile.contents(of: path, maxBytes: 1 << 20)
        } catch .tooLarge {
            throw UsageError(description: "it is over 1 MiB")
        } catch {
            throw UsageError(description: error.text)
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw UsageError(description: "it is not UTF-8 text")
        }
        return text
    }

    static func readFlagFile(_ path: String, flag: Flag, readFile: (String) throws -> String) throws(UsageError)
        -> String
    {
        guard !path.isEmpty else { throw UsageError(description: "\(flag) needs a path") }
        do {
            return try readFile(path)
        } catch {
            throw UsageError(description: "\(flag): cannot read \(path): \(error)")
        }
    }

    /// The tokens of token file `path` (`TokenFile.parse`), read with `readFile`.
    /// - Throws: a `UsageError` naming the flag, the file, the line and the reason (never a
    ///   token): `--write-token-file /run/secrets/w: line 3: the token has 15 characters; …`.
    static func readTokenFile(_ path: String, flag: Flag, readFile: (String) throws -> String) throws(UsageError)
        -> [String]
    {
        let text = try readFlagFile(path, flag: flag, readFile: readFile)
        do {
            return try TokenFile.parse(Array(text.utf8))
        } catch {
            throw UsageError(description: "\(flag) \(path): \(error)")
        }
    }

    /// The token files (docs/operations.md, "Read and write tokens"): a write-token file, maybe a read-token
    /// file, and none of the one-token flags.
    private mutating func applyTokenFiles(_ values: [Flag: String], readFile: (String) throws -> String)
        throws(UsageError)
    {
        writeTokenFile = values[.writeTokenFile]
        readTokenFile = values[.readTokenFile]
        guard writeTokenFile != nil || readTokenFile != nil else { return }
        let fileFlag = writeTokenFile != nil ? Flag.writeTokenFile : .readTokenFile
        if let old = [Flag.authToken, .authTokenFile, .authScope].first(where: { values[$0] != nil }) {
            throw UsageError(
                description: "\(fileFlag) excludes \(old): give the token files, or the one token, not both")
        }
        guard let writePath = writeTokenFile else {
            throw UsageError(
                description: "\(Flag.readTokenFile) needs \(Flag.writeTokenFile): otherwise reads would need a token "
                    + "while anyone could write")
        }
        tokenFileSignatures = [writePath, readTokenFile].compactMap { $0 }.map(CredentialReloader.Signature.init(path:))
        writeTokens = try Self.readTokenFile(writePath, flag: .writeTokenFile, readFile: readFile)
        if let readPath = readTokenFile {
            readTokens = try Self.readTokenFile(readPath, flag: .readTokenFile, readFile: readFile)
        }
    }

    /// Authentication, TLS, CORS and the connection limits.
    private mutating func applySecurity(
        _ values: [Flag: String], lists: [Flag: [String]],
        readFile: (String) throws -> String
    ) throws(UsageError) {
        try applyTokenFiles(values, readFile: readFile)
        switch (values[.authToken], values[.authTokenFile]) {
        case (.some, .some):
            throw UsageError(description: "\(Flag.authToken) and \(Flag.authTokenFile) exclude each other: give one")
        case (.some(let token), nil):
            authToken = token
        case (nil, .some(let path)):
            authToken = String(
                try Self.readFlagFile(path, flag: .authTokenFile, readFile: readFile).trimmingASCIIWhitespace())
        case (nil, nil):
            break
        }
        if let token = authToken {
            // Never echo the token: it is a secret.
            guard !token.isEmpty else { throw UsageError(description: "the auth token is empty") }
            guard BearerAuthentication.isValidToken(token) else {
                throw UsageError(
                    description: "the auth token may hold only A-Z a-z 0-9 - . _ ~ + / (then any '='), "
                        + "as a Bearer token must (RFC 6750 §2.1); try: openssl rand -hex 32")
            }
        }
        if let scope = values[.authScope] {
            guard let parsed = BearerAuthentication.Scope(rawValue: scope) else {
                throw UsageError(description: "\(Flag.authScope) must be writes or all, not \(scope)")
            }
            guard authToken != nil else {
                throw UsageError(description: "\(Flag.authScope) needs \(Flag.authToken) or \(Flag.authTokenFile)")
            }
            authScope = parsed
        }
        switch (values[.tlsCert], values[.tlsKey]) {
        case (.some(let certificate), .some(let key)):
            server.tls = TLSCredentials(
                certificatePEM: try Self.readFlagFile(certificate, flag: .tlsCert, readFile: readFile),
                privateKeyPEM: try Self.readFlagFile(key, flag: .tlsKey, readFile: readFile))
        case (.some, nil):
            throw UsageError(description: "\(Flag.tlsCert) needs \(Flag.tlsKey)")
        case (nil, .some):
            throw UsageError(description: "\(Flag.tlsKey) needs \(Flag.tlsCert)")
        case (nil, nil):
            break
        }
        if let origins = lists[.corsOrigin] {
            do {
                crossOrigin = try CrossOriginPolicy(origins: origins)
            } catch {
                throw UsageError(description: "\(Flag.corsOrigin): \(error.message)")
            }
        }
        if let count = values[.maxConnections] {
            server.maxConnections = try Self.whole(
                count, flag: .maxConnections, in: 1...1_000_000, unit: "connections")
        }
        if let count = values[.maxConnectionsPerIP] {
            server.maxConnectionsPerAddress = try Self.whole(
                count, flag: .maxConnectionsPerIP, in: 0...1_000_000,
                unit: "connections")
        }
        if let bytes = values[.maxHeaderBytes] {
            server.maxHeaderBytes = try Self.whole(
                bytes, flag: .maxHeaderBytes, in: RequestHeadBudget.maxHeaderBytesRange, unit: "bytes")
        }
        if let bytes = values[.maxURLBytes] {
            server.maxURLBytes = try Self.whole(bytes, flag: .maxURLBytes, in: 16...(1 << 20), unit: "bytes")
        }
        if let seconds = values[.idleTimeout] {
            server.idleTimeoutSeconds = try Self.whole(seconds, flag: .idleTimeout, in: 1...86_400, unit: "seconds")
        }
        if let seconds = values[.headerTimeout] {
            server.headerTimeoutSeconds = try Self.whole(
                seconds, flag: .headerTimeout, in: 1...3600, unit: "seconds")
        }
    }

    /// What the operator should hear at start: a non-loopback address without `--auth-token`
    /// (anyone who reaches it can change the token), a short token. Never the token itself. (No
    /// warning for a token over plain HTTP: in a container the service always listens on 0.0.0.0,
    /// usually behind a TLS-terminating proxy, and the warning would be noise.)
    var startupWarnings: [String] {
        var warnings: [String] = []
        for variable in unknownVariables {
            // The name only: the value may be a secret.
            warnings.append("\(variable) is not a setting of this service and is ignored (misspelt?)")
        }
        let loopback = HostAddress.isLoopback(server.host)
        if authentication == nil && !loopback {
            warnings.append(
                "listening on \(server.host), which is not loopback, without \(Flag.authToken) or \(Flag.writeTokenFile):"
                    + " anyone who reaches the port can change the device token")
        }
        if let token = authToken, token.utf8.count < 16 {
            warnings.append(
                "the auth token has only \(token.utf8.count) characters; use at least 32 random ones"
                    + " (openssl rand -hex 32)")
        }
        return warnings
    }

    /// The authentication policy the options ask for, or `nil` without a token.
    var authentication: BearerAuthentication? {
        if let writeTokens { return BearerAuthentication(writeTokens: writeTokens, readTokens: readTokens) }
        return authToken.flatMap { BearerAuthentication(token: $0, scope: authScope) }
    }

    private mutating func apply(_ values: [Flag: String]) throws(UsageError) {
        if let host = values[.host] {
            guard !host.isEmpty else { throw UsageError(description: "\(Flag.host) needs an address") }
            guard HostAddress.isValid(host) else {
                throw UsageError(description: "\(Flag.host) must be an IPv4 or IPv6 literal or localhost, not \(host)")
            }
            server.host = host
        }
        if let port = values[.port] {
            guard port.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
                let number = UInt16(port)
            else {
                throw UsageError(description: "\(Flag.port) must be a whole number from 0 to 65535, not \(port)")
            }
            server.port = number
        }
        if let seconds = values[.drainSeconds] {
            drainSeconds = try Self.whole(
                seconds, flag: .drainSeconds, in: Service.Settings.drainSecondsRange, unit: "seconds")
        }
        if let seconds = values[.maxStreamAge] {
            let range = StreamAgeLimits.range
            let value = try Self.whole(seconds, flag: .maxStreamAge, in: 0...range.upperBound, unit: "seconds")
            guard value == 0 || range.contains(value) else {
                throw UsageError(
                    description:
                        "\(Flag.maxStreamAge) must be 0 (no limit) or a whole number of seconds from \(range.lowerBound) to \(range.upperBound), not \(seconds)"
                )
            }
            maxStreamAge = value
        }
        if let seconds = values[.heartbeat] {
            server.heartbeatSeconds = try Self.whole(seconds, flag: .heartbeat, in: 1...86_400, unit: "seconds")
        }
        if let bytes = values[.maxBodyBytes] {
            server.maxBodyBytes = try Self.whole(bytes, flag: .maxBodyBytes, in: 1...(64 << 20), unit: "bytes")
        }
        if let count = values[.maxSubscribers] {
            server.maxSubscribers = try Self.whole(
                count, flag: .maxSubscribers, in: 1...1_000_000, unit: "subscribers")
        }
        if let level = values[.logLevel] {
            guard let parsed = ServerLogLevel(rawValue: level) else {
                throw UsageError(description: "\(Flag.logLevel) must be debug, info, warning or error, not \(level)")
            }
            logLevel = parsed
        }
        if let format = values[.logFormat] {
            guard let parsed = ServerLog.Format(rawValue: format) else {
                throw UsageError(description: "\(Flag.logFormat) must be text or json, not \(format)")
            }
            logFormat = parsed
        }
        if let path = values[.stateFile] {
            guard !path.isEmpty else { throw UsageError(description: "\(Flag.stateFile) needs a path") }
            stateFile = path
        }
        if let access = values[.accessLog] {
            switch access {
            case "on": accessLog = true
            case "off": accessLog = false
            default: throw UsageError(description: "\(Flag.accessLog) must be on or off, not \(access)")
            }
        }
    }

    private static func whole(_ text: String, flag: Flag, in range: ClosedRange<Int>, unit: String) throws(UsageError)
        -> Int
    {
        let digits = text.utf8.dropFirst(text.hasPrefix("-") ? 1 : 0)
        guard !digits.isEmpty, digits.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
            let value = Int(text), range.contains(value)
        else {
            throw UsageError(
                description:
                    "\(flag) must be a whole number of \(unit) from \(range.lowerBound) to \(range.upperBound), not \(text)"
            )
        }
        return value
    }
}
