import ForgePushToken
import ForgePushTokenHTTP
import ForgePushTokenOwner
import MicroHTTPDServer
import RedisTokenStore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The command line and `FORGE_PUSH_TOKEN_*` environment variables of the service
/// (http-api.md, "Command line"). A flag wins over its variable.
struct CommandLineOptions: Equatable {
    var server = ServerConfiguration()
    var logLevel: PushTokenManager.LogLevel = .info
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

    static let usage = """
        usage: forge-push-token-server [--host ADDR] [--port N] [--heartbeat SECONDS]
                                       [--max-body-bytes N] [--max-subscribers N]
                                       [--log-level debug|info|warning|error] [--access-log on|off]
                                       [--log-format text|json]
                                       [--state-file PATH]
                                       [--auth-token TOKEN | --auth-token-file PATH] [--auth-scope writes|all]
                                       [--write-token-file PATH [--read-token-file PATH]]
                                       [--tls-cert PATH --tls-key PATH] [--cors-origin ORIGIN ...]
                                       [--max-connections N] [--max-connections-per-ip N]
                                       [--max-header-bytes N] [--max-url-bytes N] [--idle-timeout SECONDS]
                                       [--header-timeout SECONDS]
                                       [--redis-url URL [--redis-password-file PATH] [--redis-key-prefix PREFIX]
                                        [--redis-tls-ca-file PATH] [--redis-tls-cert-file PATH --redis-tls-key-file PATH]
                                        [--redis-sentinel-password-file PATH] [--redis-probe-interval SECONDS]]
                                       [--drain-seconds N] [--max-stream-age SECONDS]
                                       [--version] [--help] [--health-check[=live|ready]]

          --host ADDR             IPv4 or IPv6 literal, or localhost (default 127.0.0.1)
          --port N                TCP port, 0 picks a free one (default 8080)
          --heartbeat SECONDS     keep-alive comment interval on idle streams, >= 1 (default 15)
          --max-body-bytes N      largest request body in bytes (default 4096)
          --max-subscribers N     most event-stream subscribers at once (default 10000)
          --log-level LEVEL       debug, info, warning or error (default info)
          --access-log on|off     one log line per request (default on)
          --log-format text|json  text lines, or one JSON object per line with the field names
                                  of Go's log/slog: time, level, msg (default text)
          --state-file PATH       keep the token and its version in PATH across restarts (written
                                  durably before each change is answered; default: none)
          --auth-token TOKEN      require 'Authorization: Bearer TOKEN' (RFC 6750) on POST /register
                                  and POST /fail; TOKEN is A-Z a-z 0-9 - . _ ~ + / (default: none)
          --auth-token-file PATH  the same, read from PATH (a container secret); whitespace at
                                  either end is ignored
          --auth-scope SCOPE      writes (default): only the POSTs need the token; all: every route
                                  but the probes (/healthz, /livez, /readyz), and GET/HEAD also take ?access_token=TOKEN
          --write-token-file PATH tokens that may write (POST /register, POST /fail) and read: 1 to
                                  64, one a line, 16 to 512 of A-Z a-z 0-9 - . _ ~ + / (then any
                                  '='); blank lines and # comments skipped; read again on SIGHUP
                                  and when the file changes (excludes --auth-token*, --auth-scope)
          --read-token-file PATH  tokens that may only read (GET/HEAD /token, /token/stream,
                                  /metrics, /), in the same form; then reads need a read or write
                                  token, as a Bearer header or ?access_token=; needs
                                  --write-token-file (default: reads are open)
          --tls-cert PATH         serve HTTPS with this PEM certificate (chain); needs --tls-key
          --tls-key PATH          the certificate's PEM private key, unencrypted
          --cors-origin ORIGIN    let browser pages of ORIGIN (scheme://host[:port], or * for any)
                                  read responses; repeatable (default: none)
          --max-connections N     most connections open at once, streams included; more are
                                  closed on accept (default: --max-subscribers + 1024)
          --max-connections-per-ip N
                                  most connections open at once from one client address; 0 = no
                                  limit (default 0: behind a proxy every client has one address)
          --max-header-bytes N    most bytes of request line and header fields (each field, query
                                  argument and cookie counts 48 more, the Cookie field twice);
                                  more get 431; sets the memory per connection (default 7008,
                                  an 8 KiB pool; 2048 to 15184)
          --max-url-bytes N       longest request target (path and query); longer gets 414
                                  (default 2048)
          --idle-timeout SECONDS  close an idle ordinary connection after SECONDS; event streams
                                  are exempt (default 60)
          --header-timeout SECONDS
                                  a request's head, and then its body, must arrive within
                                  SECONDS; else 408 and the connection is closed; event streams
                                  are exempt once open (default 10)
          --redis-url URL         share the token with other replicas through Redis:
                                  redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], the same with
                                  rediss:// for TLS (the certificate is always verified),
                                  redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB]
                                  (or rediss+sentinel://) to follow the master Redis Sentinel
                                  names, or unix:///PATH[?db=N] (excludes --state-file)
          --redis-password-file PATH
                                  the Redis password, read from PATH (a container secret);
                                  whitespace at either end is ignored; wins over the URL's
          --redis-key-prefix PREFIX
                                  namespace of the Redis keys, 1 to 64 of A-Z a-z 0-9 : _ . -
                                  (default forge-push-token)
          --redis-tls-ca-file PATH
                                  rediss://: PEM CA certificates that may sign Redis' certificate
                                  (default: the system's trust store)
          --redis-tls-cert-file PATH
                                  rediss://: PEM client certificate (chain allowed) for a Redis
                                  that requires one; needs --redis-tls-key-file
          --redis-tls-key-file PATH
                                  the client certificate's PEM private key, unencrypted
          --redis-sentinel-password-file PATH
                                  the sentinels' own password (requirepass in sentinel.conf),
                                  read from PATH; needs a sentinel --redis-url
          --redis-probe-interval SECONDS
                                  publish a delivery probe on PREFIX:probe this often and expect
                                  to hear it within 2 s, else redis is not_delivering (1 to 60,
                                  default 5)
          --drain-seconds N       on SIGTERM or SIGINT, stay ready to serve for N seconds while
                                  ending the event streams one by one, spread over N, so that
                                  their clients come back elsewhere a few at a time (0 to 600,
                                  default 0: end them at once; a fleet sets 5 or more)
          --max-stream-age SECONDS
                                  end each event stream cleanly after a limit drawn from
                                  [SECONDS/2, SECONDS], so that clients rebalance over replicas
                                  (0 = never, the default, or 60 to 86400)
          --version               print the version and exit
          --help                  print this help and exit
          --health-check          ask GET /healthz of the service at --host/--port (a wildcard
                                  host means loopback); exit 0 when it answers 200, else 1;
                                  --health-check=live asks /livez, --health-check=ready /readyz

        Every flag has an environment variable: FORGE_PUSH_TOKEN_ and the flag in upper case with
        - as _ (FORGE_PUSH_TOKEN_PORT=9000). A flag wins over its variable; an empty variable counts
        as unset. The variable of a repeatable flag takes a comma-separated list
        (FORGE_PUSH_TOKEN_CORS_ORIGIN=https://a,https://b).
        """

    /// The flags that take a value, in the order of the usage text.
    static let valueFlags = [
        "host", "port", "heartbeat", "max-body-bytes", "max-subscribers", "log-level", "access-log", "log-format",
        "state-file", "auth-token", "auth-token-file", "auth-scope", "write-token-file", "read-token-file", "tls-cert",
        "tls-key",
        "cors-origin", "max-connections", "max-connections-per-ip", "max-header-bytes",
        "max-url-bytes", "idle-timeout", "header-timeout", "redis-url", "redis-password-file", "redis-key-prefix",
        "redis-tls-ca-file", "redis-tls-cert-file", "redis-tls-key-file", "redis-sentinel-password-file",
        "redis-probe-interval", "drain-seconds", "max-stream-age",
    ]
    /// The value flags that may be given more than once; their values accumulate.
    static let repeatableFlags: Set = ["cors-origin"]

    /// Parses `arguments` (without the program name) over `environment`.
    /// - Parameter readFile: reads a file named by a flag (`--auth-token-file`, `--tls-cert`,
    ///   `--tls-key`) as UTF-8 text; its error's description goes into the usage error.
    static func parse(
        _ arguments: [String], environment: [String: String],
        readFile: (String) throws -> String = Self.readTextFile
    ) throws(UsageError) -> CommandLineOptions {
        var values: [String: String] = [:]
        var lists: [String: [String]] = [:]
        for flag in valueFlags {
            let variable = variable(for: flag)
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
        var listsFromFlags: Set<String> = []
        let fromEnvironment = Set(values.keys).union(lists.keys)
        var fromFlags: Set<String> = []
        var options = CommandLineOptions()
        let known = Set(valueFlags.map(variable(for:)))
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
            switch name {
            case "health-check" where inline != nil:
                // An optional value: the = form only (docs/operations.md, "Probes").
                guard let probe = HealthCheck.Probe(flagValue: inline ?? "") else {
                    throw UsageError(description: "--health-check takes live or ready, not \(inline ?? "")")
                }
                options.healthCheckProbe = probe
                if options.action == .run { options.action = .healthCheck }
            case "help", "version", "health-check":
                guard inline == nil else { throw UsageError(description: "--\(name) takes no value") }
                if options.action == .run {
                    options.action = name == "help" ? .help : name == "version" ? .version : .healthCheck
                }
            case _ where valueFlags.contains(name):
                let value: String
                if let inline {
                    value = inline
                } else {
                    guard index < arguments.count else { throw UsageError(description: "--\(name) needs a value") }
                    value = arguments[index]
                    index += 1
                }
                fromFlags.insert(name)
                if repeatableFlags.contains(name) {
                    // Flags replace the variable's list, then accumulate.
                    if listsFromFlags.insert(name).inserted { lists[name] = [] }
                    lists[name, default: []].append(value)
                } else {
                    values[name] = value
                }
            default:
                // The name alone: the value of a mistyped flag may be a secret (--auth-tokn=...).
                throw UsageError(description: "unknown option --\(name)")
            }
        }
        // --auth-token and --auth-token-file exclude each other, but a flag still wins over the
        // other one's variable.
        for (flag, other) in [("auth-token", "auth-token-file"), ("auth-token-file", "auth-token")]
        where fromFlags.contains(flag) && !fromFlags.contains(other) {
            values[other] = nil
        }
        do throws(UsageError) {
            try options.apply(values)
            try options.applySecurity(values, lists: lists, readFile: readFile)
            try options.applyRedis(values, readFile: readFile)
        } catch {
            // Name the variable when the value came from one: in a container, nobody typed a flag.
            for flag in fromEnvironment.subtracting(fromFlags).sorted()
            where error.description.hasPrefix("--\(flag) ") || error.description.hasPrefix("--\(flag):") {
                throw UsageError(description: error.description + " (set by \(Self.variable(for: flag)))")
            }
            throw error
        }
        return options
    }

    /// The log format `arguments` and `environment` ask for, found without parsing the rest (for
    /// the usage error of options that do not parse): the last `--log-format json` or
    /// `--log-format=json`, else `FORGE_PUSH_TOKEN_LOG_FORMAT`; `.text` otherwise.
    static func requestedLogFormat(_ arguments: [String], environment: [String: String]) -> ServerLog.Format {
        var format = environment[variable(for: "log-format")].flatMap(ServerLog.Format.init(rawValue:)) ?? .text
        for (index, argument) in arguments.enumerated() {
            if argument.hasPrefix("--log-format=") {
                format = ServerLog.Format(rawValue: String(argument.dropFirst("--log-format=".count))) ?? format
            } else if argument == "--log-format", index + 1 < arguments.count {
                format = ServerLog.Format(rawValue: arguments[index + 1]) ?? format
            }
        }
        return format
    }

    /// The environment variable of `flag`: `FORGE_PUSH_TOKEN_` and the flag in upper case, `-` as `_`.
    static func variable(for flag: String) -> String {
        "FORGE_PUSH_TOKEN_" + String(flag.uppercased().map { $0 == "-" ? "_" : $0 })
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

    static func readFlagFile(_ path: String, flag: String, readFile: (String) throws -> String) throws(UsageError)
        -> String
    {
        guard !path.isEmpty else { throw UsageError(description: "--\(flag) needs a path") }
        do {
            return try readFile(path)
        } catch {
            throw UsageError(description: "--\(flag): cannot read \(path): \(error)")
        }
    }

    /// The tokens of token file `path` (`TokenFile.parse`), read with `readFile`.
    /// - Throws: a `UsageError` naming the flag, the file, the line and the reason (never a
    ///   token): `--write-token-file /run/secrets/w: line 3: the token has 15 characters; …`.
    static func readTokenFile(_ path: String, flag: String, readFile: (String) throws -> String) throws(UsageError)
        -> [String]
    {
        let text = try readFlagFile(path, flag: flag, readFile: readFile)
        do {
            return try TokenFile.parse(Array(text.utf8))
        } catch {
            throw UsageError(description: "--\(flag) \(path): \(error)")
        }
    }

    /// The token files (docs/operations.md, "Read and write tokens"): a write-token file, maybe a read-token
    /// file, and none of the one-token flags.
    private mutating func applyTokenFiles(_ values: [String: String], readFile: (String) throws -> String)
        throws(UsageError)
    {
        writeTokenFile = values["write-token-file"]
        readTokenFile = values["read-token-file"]
        guard writeTokenFile != nil || readTokenFile != nil else { return }
        let fileFlag = writeTokenFile != nil ? "write-token-file" : "read-token-file"
        if let old = ["auth-token", "auth-token-file", "auth-scope"].first(where: { values[$0] != nil }) {
            throw UsageError(
                description: "--\(fileFlag) excludes --\(old): give the token files, or the one token, not both")
        }
        guard let writePath = writeTokenFile else {
            throw UsageError(
                description: "--read-token-file needs --write-token-file: otherwise reads would need a token "
                    + "while anyone could write")
        }
        tokenFileSignatures = [writePath, readTokenFile].compactMap { $0 }.map(CredentialReloader.Signature.init(path:))
        writeTokens = try Self.readTokenFile(writePath, flag: "write-token-file", readFile: readFile)
        if let readPath = readTokenFile {
            readTokens = try Self.readTokenFile(readPath, flag: "read-token-file", readFile: readFile)
        }
    }

    /// Authentication, TLS, CORS and the connection limits.
    private mutating func applySecurity(
        _ values: [String: String], lists: [String: [String]],
        readFile: (String) throws -> String
    ) throws(UsageError) {
        try applyTokenFiles(values, readFile: readFile)
        switch (values["auth-token"], values["auth-token-file"]) {
        case (.some, .some):
            throw UsageError(description: "--auth-token and --auth-token-file exclude each other: give one")
        case (.some(let token), nil):
            authToken = token
        case (nil, .some(let path)):
            authToken = String(
                try Self.readFlagFile(path, flag: "auth-token-file", readFile: readFile).trimmingASCIIWhitespace())
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
        if let scope = values["auth-scope"] {
            guard let parsed = BearerAuthentication.Scope(rawValue: scope) else {
                throw UsageError(description: "--auth-scope must be writes or all, not \(scope)")
            }
            guard authToken != nil else {
                throw UsageError(description: "--auth-scope needs --auth-token or --auth-token-file")
            }
            authScope = parsed
        }
        switch (values["tls-cert"], values["tls-key"]) {
        case (.some(let certificate), .some(let key)):
            server.tls = TLSCredentials(
                certificatePEM: try Self.readFlagFile(certificate, flag: "tls-cert", readFile: readFile),
                privateKeyPEM: try Self.readFlagFile(key, flag: "tls-key", readFile: readFile))
        case (.some, nil):
            throw UsageError(description: "--tls-cert needs --tls-key")
        case (nil, .some):
            throw UsageError(description: "--tls-key needs --tls-cert")
        case (nil, nil):
            break
        }
        if let origins = lists["cors-origin"] {
            do {
                crossOrigin = try CrossOriginPolicy(origins: origins)
            } catch {
                throw UsageError(description: "--cors-origin: \(error.message)")
            }
        }
        if let count = values["max-connections"] {
            server.maxConnections = try Self.whole(
                count, flag: "max-connections", in: 1...1_000_000, unit: "connections")
        }
        if let count = values["max-connections-per-ip"] {
            server.maxConnectionsPerAddress = try Self.whole(
                count, flag: "max-connections-per-ip", in: 0...1_000_000,
                unit: "connections")
        }
        if let bytes = values["max-header-bytes"] {
            server.maxHeaderBytes = try Self.whole(
                bytes, flag: "max-header-bytes", in: RequestHeadBudget.maxHeaderBytesRange, unit: "bytes")
        }
        if let bytes = values["max-url-bytes"] {
            server.maxURLBytes = try Self.whole(bytes, flag: "max-url-bytes", in: 16...(1 << 20), unit: "bytes")
        }
        if let seconds = values["idle-timeout"] {
            server.idleTimeoutSeconds = try Self.whole(seconds, flag: "idle-timeout", in: 1...86_400, unit: "seconds")
        }
        if let seconds = values["header-timeout"] {
            server.headerTimeoutSeconds = try Self.whole(
                seconds, flag: "header-timeout", in: 1...3600, unit: "seconds")
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
                "listening on \(server.host), which is not loopback, without --auth-token or --write-token-file:"
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

    private mutating func apply(_ values: [String: String]) throws(UsageError) {
        if let host = values["host"] {
            guard !host.isEmpty else { throw UsageError(description: "--host needs an address") }
            guard HostAddress.isValid(host) else {
                throw UsageError(description: "--host must be an IPv4 or IPv6 literal or localhost, not \(host)")
            }
            server.host = host
        }
        if let port = values["port"] {
            guard port.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
                let number = UInt16(port)
            else {
                throw UsageError(description: "--port must be a whole number from 0 to 65535, not \(port)")
            }
            server.port = number
        }
        if let seconds = values["drain-seconds"] {
            drainSeconds = try Self.whole(
                seconds, flag: "drain-seconds", in: Service.Settings.drainSecondsRange, unit: "seconds")
        }
        if let seconds = values["max-stream-age"] {
            let range = StreamAgeLimits.range
            let value = try Self.whole(seconds, flag: "max-stream-age", in: 0...range.upperBound, unit: "seconds")
            guard value == 0 || range.contains(value) else {
                throw UsageError(
                    description:
                        "--max-stream-age must be 0 (no limit) or a whole number of seconds from \(range.lowerBound) to \(range.upperBound), not \(seconds)"
                )
            }
            maxStreamAge = value
        }
        if let seconds = values["heartbeat"] {
            server.heartbeatSeconds = try Self.whole(seconds, flag: "heartbeat", in: 1...86_400, unit: "seconds")
        }
        if let bytes = values["max-body-bytes"] {
            server.maxBodyBytes = try Self.whole(bytes, flag: "max-body-bytes", in: 1...(64 << 20), unit: "bytes")
        }
        if let count = values["max-subscribers"] {
            server.maxSubscribers = try Self.whole(
                count, flag: "max-subscribers", in: 1...1_000_000, unit: "subscribers")
        }
        if let level = values["log-level"] {
            guard let parsed = PushTokenManager.LogLevel(rawValue: level) else {
                throw UsageError(description: "--log-level must be debug, info, warning or error, not \(level)")
            }
            logLevel = parsed
        }
        if let format = values["log-format"] {
            guard let parsed = ServerLog.Format(rawValue: format) else {
                throw UsageError(description: "--log-format must be text or json, not \(format)")
            }
            logFormat = parsed
        }
        if let path = values["state-file"] {
            guard !path.isEmpty else { throw UsageError(description: "--state-file needs a path") }
            stateFile = path
        }
        if let access = values["access-log"] {
            switch access {
            case "on": accessLog = true
            case "off": accessLog = false
            default: throw UsageError(description: "--access-log must be on or off, not \(access)")
            }
        }
    }

    private static func whole(_ text: String, flag: String, in range: ClosedRange<Int>, unit: String) throws(UsageError)
        -> Int
    {
        let digits = text.utf8.dropFirst(text.hasPrefix("-") ? 1 : 0)
        guard !digits.isEmpty, digits.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
            let value = Int(text), range.contains(value)
        else {
            throw UsageError(
                description:
                    "--\(flag) must be a whole number of \(unit) from \(range.lowerBound) to \(range.upperBound), not \(text)"
            )
        }
        return value
    }
}
