import GnuTLSClient

/// The one place that connects to Redis and to the sentinels, holding what every connection
/// needs: the endpoint and timeout of the configuration, the TLS credentials of a `rediss://`
/// endpoint (loaded once), and with a sentinel URL the directory of sentinels and the master in
/// use (`RedisSentinelDirectory`). Split out of `RedisLink`, which drives the link's health.
///
/// Thread-safety: immutable but for the directory, which has its own lock; all members may be
/// called from any thread.
final class RedisConnector: Sendable {
    /// Settings of the store.
    let configuration: RedisTokenStore.Configuration
    /// The TLS credentials of a `rediss://` endpoint, loaded once (`nil` for other endpoints).
    private let credentials: Result<TLSClientCredentials, TLSError>?
    /// With a sentinel URL, the sentinels and the master in use; `nil` otherwise.
    let directory: RedisSentinelDirectory?

    /// A connector for `configuration`.
    init(configuration: RedisTokenStore.Configuration) {
        self.configuration = configuration
        if configuration.endpoint.tls {
            do throws(TLSError) {
                credentials = .success(try configuration.tls.credentials())
            } catch {
                credentials = .failure(error)
            }
        } else {
            credentials = nil
        }
        directory = configuration.endpoint.sentinel.map(RedisSentinelDirectory.init)
    }

    /// The one place that connects to Redis: connect (and the TLS handshake for `rediss://`),
    /// `AUTH`, `SELECT`, bounded by the write timeout (docs/replicas.md, "Starting it"). With a
    /// sentinel URL, the master is the address a majority of the sentinels vouch for, checked
    /// with `ROLE` (`RedisSentinelDirectory`); the connection remembers the directory's generation, so that
    /// a `+switch-master` makes its owner leave it (`hasMoved`).
    func connect() throws(RedisConnectionError) -> RedisConnection {
        let loaded = try tlsCredentials()
        guard let directory else {
            return try RedisConnection(
                endpoint: configuration.endpoint, timeout: configuration.writeTimeout, credentials: loaded)
        }
        let generation = directory.generation
        let master = try directory.findMaster(like: configuration.endpoint, credentials: loaded)
        var endpoint = configuration.endpoint
        endpoint.address = .tcp(host: master.host, port: master.port)
        endpoint.sentinel = nil
        let connection: RedisConnection
        do throws(RedisConnectionError) {
            connection = try RedisConnection(
                endpoint: endpoint, timeout: configuration.writeTimeout, credentials: loaded)
            try directory.checkRole(of: connection, at: master, timeout: configuration.writeTimeout)
        } catch {
            // Ask the sentinels' majority again next time.
            directory.forget(master)
            throw error
        }
        directory.using(master)
        connection.generation = generation
        return connection
    }

    /// A connection to the sentinel at `host` (its password, no database).
    func connectSentinel(_ host: RedisEndpoint.Host) throws(RedisConnectionError) -> RedisConnection {
        guard let directory else { throw .sentinelsUnreachable("no sentinel URL") }
        return try RedisConnection(
            endpoint: directory.endpoint(of: host, like: configuration.endpoint), timeout: configuration.writeTimeout,
            credentials: try tlsCredentials(), select: false)
    }

    /// Whether `host` (a replica the sentinels' majority lists) answers `ROLE` as a master now,
    /// asked on a connection of its own with the master's credentials, within 500 ms.
    func isMaster(_ host: RedisEndpoint.Host) -> Bool {
        guard let directory else { return false }
        var endpoint = configuration.endpoint
        endpoint.address = .tcp(host: host.host, port: host.port)
        endpoint.sentinel = nil
        do throws(RedisConnectionError) {
            let timeout = RedisSentinelDirectory.decisionSeconds
            let connection = try RedisConnection(
                endpoint: endpoint, timeout: timeout, credentials: try tlsCredentials())
            try directory.checkRole(of: connection, at: host, timeout: timeout)
            return true
        } catch {
            return false
        }
    }

    /// What a majority of the sentinels say now (`RedisSentinelDirectory.vouch`).
    /// - Throws: as `vouch`; `.sentinelsUnreachable` without a sentinel URL.
    func vouch() throws(RedisConnectionError) -> RedisSentinelDirectory.Agreement {
        guard let directory else { throw .sentinelsUnreachable("no sentinel URL") }
        return try directory.vouch(like: configuration.endpoint, credentials: try tlsCredentials())
    }

    /// Whether the sentinels announced a new master since `connection` was made.
    func hasMoved(_ connection: RedisConnection) -> Bool {
        guard let directory else { return false }
        return directory.generation != connection.generation
    }

    private func tlsCredentials() throws(RedisConnectionError) -> TLSClientCredentials? {
        switch credentials {
        case .failure(let error): throw .tlsFailed(error.description)
        case .success(let loaded): return loaded
        case nil: return nil
        }
    }
}
