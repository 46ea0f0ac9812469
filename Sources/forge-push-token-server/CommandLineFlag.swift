#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Every flag of the command line, in the order of the usage text: the one place each flag's name,
/// its argument's name and its help are written (docs/operations.md lists them for operators).
/// `CommandLineOptions` parses them, `CommandLineOptions.usage` is made from them, and each has an
/// environment variable (`variable`). Thread-safety: a value type.
enum CommandLineFlag: String, CaseIterable, CustomStringConvertible, Sendable {
    /// `--host` ADDR.
    case host
    /// `--port` N.
    case port
    /// `--heartbeat` SECONDS.
    case heartbeat
    /// `--max-body-bytes` N.
    case maxBodyBytes = "max-body-bytes"
    /// `--max-subscribers` N.
    case maxSubscribers = "max-subscribers"
    /// `--log-level` LEVEL.
    case logLevel = "log-level"
    /// `--access-log` on|off.
    case accessLog = "access-log"
    /// `--log-format` text|json.
    case logFormat = "log-format"
    /// `--state-file` PATH.
    case stateFile = "state-file"
    /// `--auth-token` TOKEN.
    case authToken = "auth-token"
    /// `--auth-token-file` PATH.
    case authTokenFile = "auth-token-file"
    /// `--auth-scope` SCOPE.
    case authScope = "auth-scope"
    /// `--write-token-file` PATH.
    case writeTokenFile = "write-token-file"
    /// `--read-token-file` PATH.
    case readTokenFile = "read-token-file"
    /// `--tls-cert` PATH.
    case tlsCert = "tls-cert"
    /// `--tls-key` PATH.
    case tlsKey = "tls-key"
    /// `--cors-origin` ORIGIN.
    case corsOrigin = "cors-origin"
    /// `--max-connections` N.
    case maxConnections = "max-connections"
    /// `--max-connections-per-ip` N.
    case maxConnectionsPerIP = "max-connections-per-ip"
    /// `--max-header-bytes` N.
    case maxHeaderBytes = "max-header-bytes"
    /// `--max-url-bytes` N.
    case maxURLBytes = "max-url-bytes"
    /// `--idle-timeout` SECONDS.
    case idleTimeout = "idle-timeout"
    /// `--header-timeout` SECONDS.
    case headerTimeout = "header-timeout"
    /// `--redis-url` URL.
    case redisURL = "redis-url"
    /// `--redis-password-file` PATH.
    case redisPasswordFile = "redis-password-file"
    /// `--redis-key-prefix` PREFIX.
    case redisKeyPrefix = "redis-key-prefix"
    /// `--redis-tls-ca-file` PATH.
    case redisTLSCAFile = "redis-tls-ca-file"
    /// `--redis-tls-cert-file` PATH.
    case redisTLSCertFile = "redis-tls-cert-file"
    /// `--redis-tls-key-file` PATH.
    case redisTLSKeyFile = "redis-tls-key-file"
    /// `--redis-sentinel-password-file` PATH.
    case redisSentinelPasswordFile = "redis-sentinel-password-file"
    /// `--redis-probe-interval` SECONDS.
    case redisProbeInterval = "redis-probe-interval"
    /// `--drain-seconds` N.
    case drainSeconds = "drain-seconds"
    /// `--max-stream-age` SECONDS.
    case maxStreamAge = "max-stream-age"
    /// `--version`.
    case version
    /// `--help`.
    case help
    /// `--health-check`.
    case healthCheck = "health-check"

    /// The flag as typed: `--` and its name.
    var description: String { "--" + rawValue }

    /// Its environment variable: `FORGE_PUSH_TOKEN_` and the name in upper case, `-` as `_`.
    var variable: String {
        "FORGE_PUSH_TOKEN_" + String(rawValue.uppercased().map { $0 == "-" ? "_" : $0 })
    }

    /// Whether the flag takes a value (`--port 9000` or `--port=9000`). `--health-check` takes an
    /// optional one, in the `=` form only; `--help` and `--version` none.
    var takesValue: Bool { argument != nil }

    /// The name of its value in the help (`ADDR`, `N`, `on|off`), or `nil` for none.
    var argument: String? {
        switch self {
        case .host: "ADDR"
        case .port, .maxBodyBytes, .maxSubscribers, .maxConnections, .maxConnectionsPerIP, .maxHeaderBytes,
            .maxURLBytes, .drainSeconds:
            "N"
        case .heartbeat, .idleTimeout, .headerTimeout, .redisProbeInterval, .maxStreamAge: "SECONDS"
        case .logLevel: "LEVEL"
        case .accessLog: "on|off"
        case .logFormat: "text|json"
        case .stateFile, .authTokenFile, .writeTokenFile, .readTokenFile, .tlsCert, .tlsKey, .redisPasswordFile,
            .redisTLSCAFile, .redisTLSCertFile, .redisTLSKeyFile, .redisSentinelPasswordFile:
            "PATH"
        case .authToken: "TOKEN"
        case .authScope: "SCOPE"
        case .corsOrigin: "ORIGIN"
        case .redisURL: "URL"
        case .redisKeyPrefix: "PREFIX"
        case .version, .help, .healthCheck: nil
        }
    }

    /// Its help, in lines of at most 80 columns from column 26 of the usage text.
    var help: [String] {
        switch self {
        case .host: ["IPv4 or IPv6 literal, or localhost (default 127.0.0.1)"]
        case .port: ["TCP port, 0 picks a free one (default 8080)"]
        case .heartbeat: ["keep-alive comment interval on idle streams, >= 1 (default 15)"]
        case .maxBodyBytes: ["largest request body in bytes (default 4096)"]
        case .maxSubscribers: ["most event-stream subscribers at once (default 10000)"]
        case .logLevel: ["debug, info, warning or error (default info)"]
        case .accessLog: ["one log line per request (default on)"]
        case .logFormat:
            [
                "text lines, or one JSON object per line with the field names",
                "of Go's log/slog: time, level, msg (default text)",
            ]
        case .stateFile:
            [
                "keep the token and its version in PATH across restarts (written",
                "durably before each change is answered; default: none)",
            ]
        case .authToken:
            [
                "require 'Authorization: Bearer TOKEN' (RFC 6750) on POST /register",
                "and POST /fail; TOKEN is A-Z a-z 0-9 - . _ ~ + / (default: none)",
            ]
        case .authTokenFile:
            [
                "the same, read from PATH (a container secret); whitespace at",
                "either end is ignored",
            ]
        case .authScope:
            [
                "writes (default): only the POSTs need the token; all: every route",
                "but the probes (/healthz, /livez, /readyz), and GET/HEAD also take ?access_token=TOKEN",
            ]
        case .writeTokenFile:
            [
                "tokens that may write (POST /register, POST /fail) and read: 1 to",
                "64, one a line, 16 to 512 of A-Z a-z 0-9 - . _ ~ + / (then any",
                "'='); blank lines and # comments skipped; read again on SIGHUP",
                "and when the file changes (excludes --auth-token*, --auth-scope)",
            ]
        case .readTokenFile:
            [
                "tokens that may only read (GET/HEAD /token, /token/stream,",
                "/metrics, /), in the same form; then reads need a read or write",
                "token, as a Bearer header or ?access_token=; needs",
                "--write-token-file (default: reads are open)",
            ]
        case .tlsCert: ["serve HTTPS with this PEM certificate (chain); needs --tls-key"]
        case .tlsKey: ["the certificate's PEM private key, unencrypted"]
        case .corsOrigin:
            [
                "let browser pages of ORIGIN (scheme://host[:port], or * for any)",
                "read responses; repeatable (default: none)",
            ]
        case .maxConnections:
            [
                "most connections open at once, streams included; more are",
                "closed on accept (default: --max-subscribers + 1024)",
            ]
        case .maxConnectionsPerIP:
            [
                "most connections open at once from one client address; 0 = no",
                "limit (default 0: behind a proxy every client has one address)",
            ]
        case .maxHeaderBytes:
            [
                "most bytes of request line and header fields (each field, query",
                "argument and cookie counts 48 more, the Cookie field twice);",
                "more get 431; sets the memory per connection (default 36320,",
                "a 40 KiB pool: 8 KiB of cookies fit; 2048 to 59360)",
            ]
        case .maxURLBytes:
            [
                "longest request target (path and query); longer gets 414",
                "(default 2048)",
            ]
        case .idleTimeout:
            [
                "close an idle ordinary connection after SECONDS; event streams",
                "are exempt (default 60)",
            ]
        case .headerTimeout:
            [
                "a request's head, and then its body, must arrive within",
                "SECONDS; else 408 and the connection is closed; event streams",
                "are exempt once open (default 10)",
            ]
        case .redisURL:
            [
                "share the token with other replicas through Redis:",
                "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], the same with",
                "rediss:// for TLS (the certificate is always verified),",
                "redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB]",
                "(or rediss+sentinel://) to follow the master Redis Sentinel",
                "names, or unix:///PATH[?db=N] (excludes --state-file)",
            ]
        case .redisPasswordFile:
            [
                "the Redis password, read from PATH (a container secret);",
                "whitespace at either end is ignored; wins over the URL's",
            ]
        case .redisKeyPrefix:
            [
                "namespace of the Redis keys, 1 to 64 of A-Z a-z 0-9 : _ . -",
                "(default forge-push-token)",
            ]
        case .redisTLSCAFile:
            [
                "rediss://: PEM CA certificates that may sign Redis' certificate",
                "(default: the system's trust store)",
            ]
        case .redisTLSCertFile:
            [
                "rediss://: PEM client certificate (chain allowed) for a Redis",
                "that requires one; needs --redis-tls-key-file",
            ]
        case .redisTLSKeyFile: ["the client certificate's PEM private key, unencrypted"]
        case .redisSentinelPasswordFile:
            [
                "the sentinels' own password (requirepass in sentinel.conf),",
                "read from PATH; needs a sentinel --redis-url",
            ]
        case .redisProbeInterval:
            [
                "publish a delivery probe on PREFIX:probe this often and expect",
                "to hear it within 2 s, else redis is not_delivering (1 to 60,",
                "default 5)",
            ]
        case .drainSeconds:
            [
                "on SIGTERM or SIGINT, stay ready to serve for N seconds while",
                "ending the event streams one by one, spread over N, so that",
                "their clients come back elsewhere a few at a time (0 to 600,",
                "default 0: end them at once; a fleet sets 5 or more)",
            ]
        case .maxStreamAge:
            [
                "end each event stream cleanly after a limit drawn from",
                "[SECONDS/2, SECONDS], so that clients rebalance over replicas",
                "(0 = never, the default, or 60 to 86400)",
            ]
        case .version: ["print the version and exit"]
        case .help: ["print this help and exit"]
        case .healthCheck:
            [
                "ask GET /healthz of the service at --host/--port (a wildcard",
                "host means loopback); exit 0 when it answers 200, else 1;",
                "--health-check=live asks /livez, --health-check=ready /readyz",
            ]
        }
    }

    /// Its entry in the usage text: `--flag ARGUMENT` from column 2 and the help from column 26,
    /// on the same line when the flag is at most 23 columns wide, else from the next.
    var usageEntry: String {
        let flag = argument.map { "\(self) \($0)" } ?? description
        var lines = help.map { String(repeating: " ", count: 26) + $0 }
        if flag.count <= 23 {
            lines[0] = "  " + flag + String(repeating: " ", count: 24 - flag.count) + help[0]
        } else {
            lines.insert("  " + flag, at: 0)
        }
        return lines.joined(separator: "\n")
    }
}
