import ForgePushToken
import ForgePushTokenOwner

/// The service put together, in one place: the one owner of the token over its store, and the
/// responder that answers every route from it (docs/architecture.md, "One composition root").
///
/// Everything that runs the service builds it here: the executable (with its store from the
/// command line, under libmicrohttpd), the live-server tests (under libmicrohttpd on a free port),
/// the HTTP tests (no engine) and the fuzz harness (no engine, no socket). So each of them runs
/// the same wiring, and a new part of it is added once. An engine serves `responder`; when the
/// engine has stopped, `close()` ends the store's work.
///
/// Thread-safety: `Sendable`; `close()` once, after the engine has stopped.
public final class Service: Sendable {
    /// What the responder needs beyond the store: who may call what, which pages may read, what
    /// is logged. Defaults: an open service, no CORS, no log, no access log.
    public struct Settings: Sendable {
        /// The bearer token and its scope (`--auth-token`), or `nil` for an open service.
        public var authentication: BearerAuthentication?
        /// The origins allowed to read responses from a browser (`--cors-origin`).
        public var crossOrigin: CrossOriginPolicy
        /// Whether every finished request is logged (`--access-log`).
        public var accessLog: Bool
        /// The most event-stream subscribers at once (`--max-subscribers`, ≥ 1).
        public var maxSubscribers: Int

        /// Settings with the given values; each has the default of its flag.
        public init(
            authentication: BearerAuthentication? = nil, crossOrigin: CrossOriginPolicy = CrossOriginPolicy(),
            accessLog: Bool = false, maxSubscribers: Int = 10_000
        ) {
            self.authentication = authentication
            self.crossOrigin = crossOrigin
            self.accessLog = accessLog
            self.maxSubscribers = maxSubscribers
        }
    }

    /// The one owner of the token, started.
    public let owner: TokenOwner<TokenSnapshot>
    /// The responder an engine serves.
    public let responder: Responder

    /// The service over `store`, starting from `initial` with `health`, its owner started.
    /// - Parameters:
    ///   - store: where the token is kept; a store shared by replicas (Redis) also turns on the
    ///     HTTP layer's replica mode (`ReplicaMode(store:)`).
    ///   - initial: the state read from the store before start (a state file's contents), or
    ///     `.initial`.
    ///   - health: the store's health at start (`.starting` for a store not read yet).
    ///   - settings: authentication, CORS, access log, subscriber limit.
    ///   - log: where failures and the access log go (default: nowhere).
    public init(
        store: any TokenStore, initial: TokenState = .initial, health: StoreHealth = .ok,
        settings: Settings = Settings(), log: ServerLog? = nil
    ) {
        owner = TokenOwner(store: store, initial: initial, health: health, maxSubscribers: settings.maxSubscribers)
        owner.start()
        responder = Responder(
            owner: owner, authentication: settings.authentication, crossOrigin: settings.crossOrigin, log: log,
            accessLog: settings.accessLog, replica: ReplicaMode(store: store))
    }

    /// Shutdown's final step, after the engine has stopped: the store's background work ends
    /// (writes still in flight during graceful shutdown kept their store until now).
    public func close() {
        owner.close()
    }
}
