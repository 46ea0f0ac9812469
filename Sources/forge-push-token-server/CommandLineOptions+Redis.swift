import RedisTokenStore

extension CommandLineOptions {
    /// The flags of TLS to Redis, which need a `rediss://` URL.
    static let redisTLSFlags = [Flag.redisTLSCAFile, .redisTLSCertFile, .redisTLSKeyFile]

    /// `--redis-url`, `--redis-password-file`, `--redis-key-prefix`, `--redis-sentinel-password-file`,
    /// `--redis-probe-interval` and the `--redis-tls-*` flags (docs/replicas.md, "Starting it", "TLS to Redis" and "Redis
    /// Sentinel"). No message ever holds the password,
    /// the URL (which may hold it) or a key's contents.
    mutating func applyRedis(_ values: [Flag: String], readFile: (String) throws -> String) throws(UsageError) {
        guard let url = values[.redisURL] else {
            for flag in [Flag.redisPasswordFile, .redisKeyPrefix, .redisSentinelPasswordFile, .redisProbeInterval]
                + Self.redisTLSFlags
            where values[flag] != nil {
                throw UsageError(description: "\(flag) needs \(Flag.redisURL)")
            }
            return
        }
        if stateFile != nil {
            throw UsageError(
                description:
                    "\(Flag.redisURL) and \(Flag.stateFile) exclude each other: with \(Flag.redisURL), Redis keeps "
                    + "the state (leave \(Flag.stateFile) out, or set FORGE_PUSH_TOKEN_STATE_FILE to an empty value)")
        }
        var endpoint: RedisEndpoint
        do {
            endpoint = try RedisEndpoint.parse(url)
        } catch {
            throw UsageError(description: "\(Flag.redisURL): \(error)")
        }
        if let path = values[.redisPasswordFile] {
            let text = try Self.readFlagFile(path, flag: .redisPasswordFile, readFile: readFile)
            let password = text.trimmingASCIIWhitespace()
            guard !password.isEmpty else {
                throw UsageError(description: "\(Flag.redisPasswordFile): \(path) holds no password")
            }
            endpoint.password = Array(password.utf8)
        }
        if let path = values[.redisSentinelPasswordFile] {
            guard endpoint.sentinel != nil else {
                throw UsageError(
                    description:
                        "\(Flag.redisSentinelPasswordFile) needs a redis+sentinel:// or rediss+sentinel:// \(Flag.redisURL)"
                )
            }
            let password = try Self.readFlagFile(path, flag: .redisSentinelPasswordFile, readFile: readFile)
                .trimmingASCIIWhitespace()
            guard !password.isEmpty else {
                throw UsageError(description: "\(Flag.redisSentinelPasswordFile): \(path) holds no password")
            }
            endpoint.sentinel?.password = Array(password.utf8)
        }
        var prefix = RedisKeyPrefix.standard
        if let text = values[.redisKeyPrefix] {
            guard let parsed = RedisKeyPrefix(text) else {
                throw UsageError(description: "\(Flag.redisKeyPrefix) must be 1 to 64 of A-Z a-z 0-9 : _ . -")
            }
            prefix = parsed
        }
        var configuration = RedisTokenStore.Configuration(endpoint: endpoint, prefix: prefix)
        configuration.tls = try Self.redisTLS(values, tls: endpoint.tls, readFile: readFile)
        if let text = values[.redisProbeInterval] {
            guard text.count <= 2, text.allSatisfy({ $0.isASCII && $0.isNumber }), let seconds = Int(text),
                (1...60).contains(seconds)
            else {
                throw UsageError(description: "\(Flag.redisProbeInterval) must be whole seconds from 1 to 60")
            }
            configuration.probeInterval = Double(seconds)
        }
        redis = configuration
    }

    /// The `--redis-tls-*` flags, read and checked as a replica loads them.
    private static func redisTLS(
        _ values: [Flag: String], tls: Bool, readFile: (String) throws -> String
    ) throws(UsageError) -> RedisTLSSettings {
        guard tls else {
            for flag in redisTLSFlags where values[flag] != nil {
                throw UsageError(
                    description: "\(flag) needs a rediss:// or rediss+sentinel:// \(Flag.redisURL) (TLS to Redis)")
            }
            return RedisTLSSettings()
        }
        if (values[.redisTLSCertFile] == nil) != (values[.redisTLSKeyFile] == nil) {
            throw UsageError(
                description: "\(Flag.redisTLSCertFile) and \(Flag.redisTLSKeyFile) go together: give both or neither")
        }
        var settings = RedisTLSSettings()
        if let path = values[.redisTLSCAFile] {
            settings.caPEM = Array(try readFlagFile(path, flag: .redisTLSCAFile, readFile: readFile).utf8)
        }
        if let certificate = values[.redisTLSCertFile], let key = values[.redisTLSKeyFile] {
            settings.certificatePEM = Array(
                try readFlagFile(certificate, flag: .redisTLSCertFile, readFile: readFile).utf8)
            settings.keyPEM = Array(try readFlagFile(key, flag: .redisTLSKeyFile, readFile: readFile).utf8)
        }
        do throws(RedisTLSSettings.Invalid) {
            try settings.validate()
        } catch {
            switch error.part {
            case .caFile: throw UsageError(description: "\(Flag.redisTLSCAFile): \(error)")
            case .systemTrustStore:
                throw UsageError(description: "\(Flag.redisURL): rediss:// needs a trust store: \(error)")
            case .clientCertificate:
                throw UsageError(description: "\(Flag.redisTLSCertFile)/\(Flag.redisTLSKeyFile): \(error)")
            }
        }
        return settings
    }
}
