import ForgePushToken

/// A store that keeps the state in the process and, durably, in a `StateFile` (`--state-file`):
/// every change is written (temporary file, `fsync`, rename, `fsync` of the folder) before its
/// commit completes, so an acknowledged change survives a crash.
///
/// A change whose write fails still stands: the outcome is `.notSaved` (the service answers
/// `503 state_not_saved`, keeps serving and streaming the new token, and reports itself
/// degraded), and the next commit writes the current state again, even when it changes nothing
/// (a client retrying the same token must not hear that all is well while it is not).
///
/// Thread-safety: the owner serialises commits (`.ownerSerialized`); `unsaved` is behind a lock
/// of its own all the same, so that the store is safe from any thread.
public final class StateFileStore: TokenStore {
    /// The file written on every change.
    public let file: StateFile
    /// Whether the last write failed (the owner's state is newer than the file's).
    private let unsaved = Locked(false)

    /// A store writing to `file`.
    public init(file: StateFile) {
        self.file = file
    }

    /// Reads the state to start from: the file's contents, or `TokenState.initial` when it does
    /// not exist yet (a first start).
    /// - Throws: `StateFile.Failure` when it exists but cannot be read or is not a state file.
    public func load() throws(StateFile.Failure) -> TokenState {
        guard let contents = try file.load() else { return .initial }
        return TokenState(version: contents.version, token: contents.token)
    }

    /// `.ownerSerialized`: the decision is a comparison with the owner's state.
    public var ordering: CommitOrdering { .ownerSerialized }

    /// `true`: every change is written to the file, and a write can fail.
    public var savesState: Bool { true }

    /// Decides against `base`, writes the new state (or `base` again while unsaved) and completes
    /// at once: `.applied`/`.unchanged` when the file holds the result, `.notSaved` when not.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        completion(decide(token, base: base))
    }

    /// The decision of `commit(_:base:completion:)` (the file written first), returned.
    public func commitNow(_ token: String?, base: TokenState) -> CommitOutcome? {
        decide(token, base: base)
    }

    private func decide(_ token: String?, base: TokenState) -> CommitOutcome {
        let changed = token != base.token
        guard !changed || base.version < .max else { return .versionExhausted }
        let state = changed ? base.changed(to: token) : base
        guard changed || unsaved.withLock({ $0 }) else { return .unchanged(base) }
        do throws(StateFile.Failure) {
            try file.save(.init(token: state.token, version: state.version))
            unsaved.withLock { $0 = false }
            return changed ? .applied(state) : .unchanged(state)
        } catch {
            unsaved.withLock { $0 = true }
            return .notSaved(state, changed: changed, reason: error.description)
        }
    }

    /// Nothing to report but the outcomes of commits: nobody else writes the file.
    public func start(reporting report: @escaping @Sendable (TokenStoreEvent) -> Void) {}

    /// Nothing to stop.
    public func stop() {}
}
