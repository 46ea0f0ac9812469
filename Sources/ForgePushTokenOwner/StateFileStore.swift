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
        /// While the writer gathers the next batch (`gather(_:within:)`): the number of waiting
        /// writes at which it goes on at once, told by the `commit` that reaches it.
        var gatherTarget: Int?
        /// Set by `stop()`: the writer no longer gathers (nobody is coming back).
        var stopped = false
    }

    private let batch = Locked(Batch())
    private let queue: DispatchQueue
    /// Signalled once by the `commit` whose write reaches `Batch.gatherTarget`.
    private let gathered = DispatchSemaphore(value: 0)

    /// The least time the writer gathers for (see `writeBatches`).
    private let minimumGathering: Duration

    /// A store writing to `file`, its batches written by work items on `queue` (a serial queue;
    /// one of its own by default). `minimumGathering` is the least time the writer waits for the
    /// writes of the last batch to come back before it writes the next one (it waits as long as
    /// the last file write took, and ends as soon as they are back): zero by default; tests hold
    /// it open with a long one, so that only the writers' return ends it.
    public init(
        file: StateFile, queue: DispatchQueue = DispatchQueue(label: "forge-push-token.state-file"),
        minimumGathering: Duration = .zero
    ) {
        self.file = file
        self.queue = queue
        self.minimumGathering = minimumGathering
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
            case endGathering
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
            if let target = batch.gatherTarget, batch.waiting.count >= target {
                batch.gatherTarget = nil
                return .endGathering
            }
            if batch.writing { return .wait }
            batch.writing = true
            return .write
        }
        switch next {
        case .answer(let outcome): completion(outcome)
        case .wait: break
        case .endGathering: gathered.signal()
        case .write: queue.async { [self] in writeBatches() }
        }
    }

    /// Writes batches until no write is waiting: each takes every write decided so far and
    /// writes the newest state once.
    ///
    /// Before taking the next batch, the writer gathers (`gather(_:within:)`): it waits until as
    /// many writes wait as were in flight during the last file write (those it answered and those
    /// that arrived meanwhile), or for as long as that file write took, whichever comes first.
    /// Without it, clients that write again as soon as they are answered split into two groups
    /// that alternate, each waiting for the other's file write and then its own: half of them per
    /// `fsync` (about 30 of 64 connections here), two file writes per request. Gathered, one
    /// `fsync` carries them all. Bounded by the last file write's duration, the wait at most
    /// doubles a write's latency when the clients do not come back (PostgreSQL's `commit_delay`
    /// makes the same trade, with a fixed delay).
    private func writeBatches() {
        var inFlight = 0
        var lastWrite: Duration = .zero
        while true {
            if inFlight > 0 { gather(inFlight, within: max(lastWrite, minimumGathering)) }
            let (taken, state) = batch.withLock { batch -> ([Waiting], TokenState) in
                let taken = batch.waiting
                batch.waiting = []
                if taken.isEmpty { batch.writing = false }
                return (taken, batch.decided)
            }
            if taken.isEmpty { return }
            var failure: StateFile.Failure?
            var written: StateFile.Replacement?
            let clock = ContinuousClock()
            let started = clock.now
            do throws(StateFile.Failure) {
                // `save(_:)` in its two stages, so that the file can be closed after the answers.
                let replacement = try file.replace(with: .init(token: state.token, version: state.version))
                written = replacement
                try file.flushFolder(of: replacement)
            } catch {
                failure = error
            }
            lastWrite = clock.now - started
            let arrived = batch.withLock { batch in
                batch.unsaved = failure != nil
                batch.fileWrites &+= 1
                return batch.waiting.count
            }
            inFlight = taken.count + arrived
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

    /// Waits until `target` writes wait or `limit` has passed (see `writeBatches`).
    private func gather(_ target: Int, within limit: Duration) {
        let enough = batch.withLock { batch in
            if batch.waiting.count >= target || batch.stopped { return true }
            batch.gatherTarget = target
            return false
        }
        if enough { return }
        let (seconds, attoseconds) = limit.components
        // Saturated: a limit past Int64's nanoseconds (292 years) waits "forever".
        let nanoseconds =
            seconds >= Int64.max / 1_000_000_000 ? Int64.max : seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        if gathered.wait(timeout: .now() + .nanoseconds(Int(clamping: nanoseconds))) == .success { return }
        let signalled = batch.withLock { batch in
            defer { batch.gatherTarget = nil }
            return batch.gatherTarget == nil
        }
        // A `commit` reached the target after the timeout and before the lock: its signal is
        // coming; take it, so that the next gathering does not end at once.
        if signalled { gathered.wait() }
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

    /// Ends a gathering at once (and every later one), waits until every write already decided
    /// has been written and answered, and closes the last file written.
    public func stop() {
        let gathering = batch.withLock { batch in
            batch.stopped = true
            defer { batch.gatherTarget = nil }
            return batch.gatherTarget != nil
        }
        if gathering { gathered.signal() }
        // A `commit` decides to start the writer under the lock and enqueues it after: until the
        // writer has run and found nothing left, `writing` stays set.
        repeat { queue.sync {} } while batch.withLock({ $0.writing })
        queue.sync { keepOpen(nil) }
    }

    deinit {
        batch.withLock { $0.lastWritten }?.close()
    }
}
