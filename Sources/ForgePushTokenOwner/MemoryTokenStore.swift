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

    /// `.unchanged(base)` for the current token, `.versionExhausted` at version 2^64 - 1, else
    /// `.applied` at the next version; always returned (the `.ownerSerialized` contract), so
    /// `completion` is never called.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?
    {
        if token == base.token { return .unchanged(base) }
        guard base.version < .max else { return .versionExhausted }
        return .applied(base.changed(to: token))
    }

    /// Nothing to report: memory never fails and nothing else writes to it.
    public func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {}

    /// Nothing to stop.
    public func stop() {}
}
