/// A store that keeps nothing beyond the owner's own state: the service alone, without
/// `--state-file`. A change is any token other than the current one; it is never lost while the
/// process runs and always lost when it stops.
///
/// Thread-safety: stateless; `commit` may be called from any thread.
public final class MemoryTokenStore: TokenStore {
    /// Creates the store.
    public init() {}

    /// `.ownerSerialized`: the decision is a comparison with the owner's state.
    public var ordering: CommitOrdering { .ownerSerialized }

    /// `.unchanged(base)` for the current token, else `.applied` at the next version; at once.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        completion(decide(token, base: base))
    }

    /// The decision of `commit(_:base:completion:)`, returned.
    public func commitNow(_ token: String?, base: TokenState) -> CommitOutcome? {
        decide(token, base: base)
    }

    private func decide(_ token: String?, base: TokenState) -> CommitOutcome {
        if token == base.token { return .unchanged(base) }
        guard base.version < .max else { return .versionExhausted }
        return .applied(base.changed(to: token))
    }

    /// Nothing to report: memory never fails and nothing else writes to it.
    public func start(reporting report: @escaping @Sendable (TokenStoreEvent) -> Void) {}

    /// Nothing to stop.
    public func stop() {}
}
