import RedisTokenStore

extension CommandLineOptions {
    /// `--redis-url`, `--redis-password-file`, `--redis-key-prefix` (docs/replicas.md, "Starting
    /// it"). No message ever holds the password or the URL (which may hold it).
    mutating func applyRedis(_ values: [String: String], readFile: (String) throws -> String) throws(UsageError) {
        guard let url = values["redis-url"] else {
            for flag in ["redis-password-file", "redis-key-prefix"] where values[flag] != nil {
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
        var prefix = RedisKeyPrefix.standard
        if let text = values["redis-key-prefix"] {
            guard let parsed = RedisKeyPrefix(text) else {
                throw UsageError(description: "--redis-key-prefix must be 1 to 64 of A-Z a-z 0-9 : _ . -")
            }
            prefix = parsed
        }
        redis = RedisTokenStore.Configuration(endpoint: endpoint, prefix: prefix)
    }
}
