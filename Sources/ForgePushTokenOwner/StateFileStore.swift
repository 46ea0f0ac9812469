import Dispatch
import ForgePushToken

/// A store that keeps the state in the process and, durably, in a `StateFile` (`--state-file`),
/// with group commit: a write is answered only after a state holding it has been written
/// (temporary file, `fsync`, rename, `fsync` of the folder), and the writes that arrive while one
/// such write runs are made durable together by the next one (as PostgreSQL's group commit and
/// Redis' `appendfsync always`, which writes once per event-loop turn, do). Versions stay one per
/// change: each write is decided at once against the newest decided state, in arrival order, and
/// only the newest state of a batch is written, since it holds every change before it.
///
/// The owner applies (and streams) a change only from its outcome, which comes after the `fsync`
/// that holds it: no event reaches a subscriber before its state is on disk, and an acknowledged
/// change survives a crash.
///
/// A change whose write fails still stands: the outcome is `.notSaved` (the service answers
/// `503 state_not_saved`, keeps serving and streaming the new token, and reports itself
/// degraded), and the next commit writes the current state again, even when it changes nothing
/// (a client retrying the same token must not hear that all is well while it is not).
///
/// The batches are written by work items on one serial Dispatch queue: an item runs while writes
/// are waiting and ends when none is left, so no thread is kept while the store is idle.
///
/// Thread-safety: all members may be called from any thread; the decided state, the waiting
/// writes and the flags live behind one lock, never held during file I/O or a completion.
public final class StateFileStore: TokenStore {
    /// The file written on every change.
    public let file: StateFile

    /// One write waiting for the `fsync` that holds it.
    private struct Waiting {
        /// The state this write decided.
        var state: TokenState
        /// Whether it changed the token.
        var changed: Bool
        /// Receives the outcome.
        var completion: @Sendable (CommitOutcome) -> Void
    }

    /// What the lock guards.
    private struct Batch {
        /// The newest decided state: what the next write decides against, and what the next
        /// batch writes.
        var decided: TokenState = .initial
        /// Writes decided and waiting for their batch, in version order.
        var waiting: [Waiting] = []
        /// Whether a work item is writing batches (it takes `waiting` until it is empty).
        var writing = false
        /// Whether the last write failed (the decided state is newer than the file's).
        var unsaved = false
        /// Writes of the file (successful or not), each holding one batch.
        var fileWrites: UInt64 = 0
        /// The last file written, kept open until the next one has replaced it and its batch is
        /// answered: the rename that replaces an open file only unlinks it, and freeing its blocks
        /// (a synchronous discard on a disk mounted with `discard`: 0.11 to 0.17 ms of a 0.5 to
        /// 1 ms save here) happens at its close, after the answers (`StateFile.Replacement`).
        var lastWritten: StateFile.Replacement?
    }

    private let batch = Locked(Batch())
    private let queue: DispatchQueue

    /// A store writing to `file`, its batches written by work items on `queue` (a serial queue;
    /// one of its own by default).
    public init(file: StateFile, queue: DispatchQueue = DispatchQueue(label: "forge-push-token.state-file")) {
        self.file = file
        self.queue = queue
    }

    /// Reads the state to start from: the file's contents, or `TokenState.initial` when it does
    /// not exist yet (a first start); the store decides the next write against it.
    /// - Throws: `StateFile.Failure` when it exists but cannot be read or is not a state file.
    public func load() throws(StateFile.Failure) -> TokenState {
        let state: TokenState
        if let contents = try file.load() {
            state = TokenState(version: contents.version, token: contents.token)
        } else {
            state = .initial
        }
        batch.withLock { $0.decided = state }
        return state
    }

    /// `.storeSerialized`: the store decides every write against its own newest state, and
    /// answers later, after the `fsync` of the batch that holds it.
    public var ordering: CommitOrdering { .storeSerialized }

    /// Decides `token` against the newest decided state (`base` is not needed) and completes
    /// once a state holding the decision is on disk: `.applied`/`.unchanged` when the file holds
    /// it, `.notSaved` when the write failed, `.versionExhausted` at once at 2^64 - 1. The same
    /// token with nothing waiting and the file current completes at once, on the caller's
    /// thread; every other outcome comes on the store's queue, in version order.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        enum Next {
            case answer(CommitOutcome)
            case wait
            case write
        }
        let next = batch.withLock { batch -> Next in
            let changed = token != batch.decided.token
            if changed && batch.decided.version == .max { return .answer(.versionExhausted) }
            if !changed && batch.waiting.isEmpty && !batch.writing && !batch.unsaved {
                return .answer(.unchanged(batch.decided))
            }
            if changed { batch.decided = batch.decided.changed(to: token) }
            batch.waiting.append(Waiting(state: batch.decided, changed: changed, completion: completion))
            if batch.writing { return .wait }
            batch.writing = true
            return .write
        }
        switch next {
        case .answer(let outcome): completion(outcome)
        case .wait: break
        case .write: queue.async { [self] in writeBatches() }
        }
    }

    /// Writes batches until no write is waiting: each takes every write decided so far and
    /// writes the newest state once.
    private func writeBatches() {
        while true {
            let (taken, state) = batch.withLock { batch -> ([Waiting], TokenState) in
                let taken = batch.waiting
                batch.waiting = []
                if taken.isEmpty { batch.writing = false }
                return (taken, batch.decided)
            }
            if taken.isEmpty { return }
            var failure: StateFile.Failure?
            var written: StateFile.Replacement?
            do throws(StateFile.Failure) {
                // `save(_:)` in its two stages, so that the file can be closed after the answers.
                let replacement = try file.replace(with: .init(token: state.token, version: state.version))
                written = replacement
                try file.flushFolder(of: replacement)
            } catch {
                failure = error
            }
            batch.withLock { batch in
                batch.unsaved = failure != nil
                batch.fileWrites &+= 1
            }
            for write in taken {
                if let failure {
                    write.completion(.notSaved(write.state, changed: write.changed, reason: failure.description))
                } else {
                    write.completion(write.changed ? .applied(write.state) : .unchanged(write.state))
                }
            }
            if let written { keepOpen(written) }
        }
    }

    /// Keeps `written` open as the last file written and closes the one it replaced (on the
    /// store's queue, after that batch's answers).
    private func keepOpen(_ written: StateFile.Replacement?) {
        let replaced = batch.withLock { batch in
            defer { batch.lastWritten = written }
            return batch.lastWritten
        }
        replaced?.close()
    }

    /// Nothing to report but the outcomes of commits: nobody else writes the file.
    public func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {}

    /// A durable copy that can fail to be saved: `durableWrites` counts the writes of the file
    /// (successful or not), each making a batch of changes durable (beside the count of changes it
    /// shows how many one `fsync` carries; the HTTP layer serves it, docs/operations.md).
    public func status() -> StoreStatus {
        StoreStatus(durableWrites: batch.withLock { $0.fileWrites })
    }

    /// Waits until every write already decided has been written and answered, and closes the
    /// last file written.
    public func stop() {
        queue.sync { keepOpen(nil) }
    }

    deinit {
        batch.withLock { $0.lastWritten }?.close()
    }
}
