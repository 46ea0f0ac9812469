import RedisTokenStore

extension CommandLineOptions {
    /// The flags of TLS to Redis, which need a `rediss://` URL.
    static let redisTLSFlags = ["redis-tls-ca-file", "redis-tls-cert-file", "redis-tls-key-file"]

    /// `--redis-url`, `--redis-password-file`, `--redis-key-prefix`, `--redis-sentinel-password-file`,
    /// `--redis-probe-interval` and the `--redis-tls-*` flags (docs/replicas.md, "Starting it", "TLS to Redis" and "Redis
    /// Sentinel"). No message ever holds the password,
    /// the URL (which may hold it) or a key's contents.
    mutating func applyRedis(_ values: [String: String], readFile: (String) throws -> String) throws(UsageError) {
        guard let url = values["redis-url"] else {
            for flag in [
                "redis-password-file", "redis-key-prefix", "redis-sentinel-password-file", "redis-probe-interval",
            ] + Self.redisTLSFlags
            where values[flag] != nil {
                throw UsageError(description: "--\(flag) needs --redis-url")
            }
            return
        }
        if stateFile != nil {
            throw UsageError(
                description: "--redis-url and --state-file exclude each other: with --redis-url, Redis keeps "
                    + "the state (leave --state-file out, or set FORGE_PUSH_TOKEN_STATE_FILE to an empty value)")
        }
        var endpoint: RedisEndpoint
        do {
            endpoint = try RedisEndpoint.parse(url)
        } catch {
            throw UsageError(description: "--redis-url: \(error)")
        }
        if let path = values["redis-password-file"] {
            let text = try Self.readFlagFile(path, flag: "redis-password-file", readFile: readFile)
            let password = text.trimmingASCIIWhitespace()
            guard !password.isEmpty else {
                throw UsageError(description: "--redis-password-file: \(path) holds no password")
            }
            endpoint.password = Array(password.utf8)
        }
        if let path = values["redis-sentinel-password-file"] {
            guard endpoint.sentinel != nil else {
                throw UsageError(
                    description:
                        "--redis-sentinel-password-file needs a redis+sentinel:// or rediss+sentinel:// --redis-url")
            }
            let password = try Self.readFlagFile(path, flag: "redis-sentinel-password-file", readFile: readFile)
                .trimmingASCIIWhitespace()
            guard !password.isEmpty else {
                throw UsageError(description: "--redis-sentinel-password-file: \(path) holds no password")
            }
            endpoint.sentinel?.password = Array(password.utf8)
        }
        var prefix = RedisKeyPrefix.standard
        if let text = values["redis-key-prefix"] {
            guard let parsed = RedisKeyPrefix(text) else {
                throw UsageError(description: "--redis-key-prefix must be 1 to 64 of A-Z a-z 0-9 : _ . -")
            }
            prefix = parsed
        }
        var configuration = RedisTokenStore.Configuration(endpoint: endpoint, prefix: prefix)
        configuration.tls = try Self.redisTLS(values, tls: endpoint.tls, readFile: readFile)
        if let text = values["redis-probe-interval"] {
            guard text.count <= 2, text.allSatisfy({ $0.isASCII && $0.isNumber }), let seconds = Int(text),
                (1...60).contains(seconds)
            else {
                throw UsageError(description: "--redis-probe-interval must be whole seconds from 1 to 60")
            }
            configuration.probeInterval = Double(seconds)
        }
        redis = configuration
    }

    /// The `--redis-tls-*` flags, read and checked as a replica loads them.
    private static func redisTLS(
        _ values: [String: String], tls: Bool, readFile: (String) throws -> String
    ) throws(UsageError) -> RedisTLSSettings {
        guard tls else {
            for flag in redisTLSFlags where values[flag] != nil {
                throw UsageError(
                    description: "--\(flag) needs a rediss:// or rediss+sentinel:// --redis-url (TLS to Redis)")
            }
            return RedisTLSSettings()
        }
        if (values["redis-tls-cert-file"] == nil) != (values["redis-tls-key-file"] == nil) {
            throw UsageError(
                description: "--redis-tls-cert-file and --redis-tls-key-file go together: give both or neither")
        }
        var settings = RedisTLSSettings()
        if let path = values["redis-tls-ca-file"] {
            settings.caPEM = Array(try readFlagFile(path, flag: "redis-tls-ca-file", readFile: readFile).utf8)
        }
        if let certificate = values["redis-tls-cert-file"], let key = values["redis-tls-key-file"] {
            settings.certificatePEM = Array(
                try readFlagFile(certificate, flag: "redis-tls-cert-file", readFile: readFile).utf8)
            settings.keyPEM = Array(try readFlagFile(key, flag: "redis-tls-key-file", readFile: readFile).utf8)
        }
        do throws(RedisTLSSettings.Invalid) {
            try settings.validate()
        } catch {
            switch error.part {
            case .caFile: throw UsageError(description: "--redis-tls-ca-file: \(error)")
            case .systemTrustStore:
                throw UsageError(description: "--redis-url: rediss:// needs a trust store: \(error)")
            case .clientCertificate:
                throw UsageError(description: "--redis-tls-cert-file/--redis-tls-key-file: \(error)")
            }
        }
        return settings
    }
}
