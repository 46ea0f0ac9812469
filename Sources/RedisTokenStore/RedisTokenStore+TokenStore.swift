import ForgePushTokenOwner

/// `RedisTokenStore` behind the owner's store seam (docs/architecture.md, "The store seam";
/// docs/replicas.md).
///
/// Commits are ordered by Redis itself (`.storeSerialized`): each runs the change script
/// atomically against the stored state, so the owner's `base` is not needed. Outcomes map as
/// follows: changed → `.applied`, not changed → `.unchanged` (both with the state Redis holds,
/// which may be newer than the replica's), no reply within the write timeout → `.unknown`, not
/// asked or refused → `.unavailable`. Reports: every state learned from Redis → `.changed`
/// (the owner applies only newer ones); health `connected` → `.ok`, any other → `.degraded`
/// with the reason (`unreachable`, `auth_failed`, `invalid_state`) once the state has been read,
/// `.starting` with the reason before.
extension RedisTokenStore: TokenStore {
    /// `.storeSerialized`: Redis decides every commit atomically, and commits may overlap.
    public var ordering: CommitOrdering { .storeSerialized }

    /// Runs the change script for `token` (see `commit(token:completion:)`); `base` is ignored.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        commit(token: token) { outcome in
            switch outcome {
            case .applied(let state, let changed):
                let applied = TokenState(version: state.version, token: state.token)
                completion(changed ? .applied(applied) : .unchanged(applied))
            case .unavailable(let health):
                completion(.unavailable(reason: "Redis: \(health.rawValue)"))
            case .unknown:
                completion(.unknown(reason: "Redis did not answer the write in time"))
            }
        }
    }

    /// `redis`: the field of `/healthz` that carries the link's state (docs/replicas.md).
    public var replicaName: String? { "redis" }

    /// What the owner's health is before the store reported anything: `.starting`, `unreachable`.
    public static let healthAtStart = StoreHealth.starting(reason: Health.unreachable.rawValue)

    /// Reads `PREFIX:state` again soon (a subscriber's `Last-Event-ID` is above the replica's).
    public func refresh() {
        refresh { _ in }
    }

    /// `renderMetrics()`.
    public func metricsText() -> String {
        renderMetrics()
    }

    /// Starts the store's threads, reporting changes and health to the owner.
    public func start(reporting report: @escaping @Sendable (TokenStoreEvent) -> Void) {
        start(
            onState: { state in
                report(.changed(TokenState(version: state.version, token: state.token)))
            },
            onHealth: { health, stateRead in
                report(.health(Self.storeHealth(health, stateRead: stateRead)))
            })
    }

    /// The owner's view of `health`: `.ok` when connected, else `.degraded` (the state was read
    /// once and is served, possibly stale) or `.starting` (no state yet), with the reason.
    public static func storeHealth(_ health: Health, stateRead: Bool) -> StoreHealth {
        if health == .connected { return .ok }
        return stateRead ? .degraded(reason: health.rawValue) : .starting(reason: health.rawValue)
    }
}
