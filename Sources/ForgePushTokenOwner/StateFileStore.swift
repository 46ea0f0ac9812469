import Dispatch
import ForgePushToken

/// A store that keeps the state in the process and, durably, in a `StateFile` (`--state-file`),
/// with group commit: a write is answered only after a state holding it has been written
/// (temporary file, `fsync`, rename, `fsync` of the folder), and the writes that arrive while one
/// such write runs are made durable together by the next one (as PostgreSQL's group commit and
/// Redis' `appendfsync always`, which writes once per event-loop turn, do). Versions stay one per
/// change: the writes of a batch are decided when the batch is taken, in arrival order, against
/// the last state written, and only the newest state of a batch is written, since it holds every
/// change before it.
///
/// The owner applies (and streams) a change only from its outcome, which comes after the `fsync`
/// that holds it: no event reaches a subscriber before its state is on disk, and an acknowledged
/// change survives a crash.
///
/// A change whose write fails does not stand: every write of the failed batch is answered
/// `.notSaved` (the service answers `503 state_not_saved` and reports itself degraded), and the
/// store's state stays the last one written, which the owner serves. The failed write may or may
/// not have reached the disk (a rename can land before the folder's `fsync` fails), so the store
/// keeps the highest version it tried: the next change takes a version above it, the next write
/// of the file records it (`StateFile.Contents.tried`) so that a restart does the same, and that
/// write happens on the next commit even when it changes nothing (the file may hold a state other
/// than the one served). Nothing retries a failed write; the client does.
///
/// The batches are written by work items on one serial Dispatch queue: an item runs while writes
/// are waiting and ends when none is left, so no thread is kept while the store is idle.
///
/// Thread-safety: all members may be called from any thread; the state written, the waiting
/// writes and the flags live behind one lock, never held during file I/O or a completion.
public final class StateFileStore: TokenStore {
    /// The file written on every change.
    public let file: StateFile

    /// One write waiting for the batch that decides it and the `fsync` that holds it.
    private struct Waiting {
        /// The token it proposes.
        var token: String?
        /// Receives the outcome.
        var completion: @Sendable (CommitOutcome) -> Void
    }

    /// What the lock guards.
    private struct Batch {
        /// The last state written (or read at start): the owner's state, and what the next batch
        /// decides against.
        var written: TokenState = .initial
        /// The highest version any write has tried (≥ `written.version`): the next change takes
        /// one above it.
        var tried: UInt64 = 0
        /// Writes waiting for their batch, in arrival order.
        var waiting: [Waiting] = []
        /// Whether a work item is writing batches (it takes `waiting` until it is empty).
        var writing = false
        /// Whether the last write failed: the file may hold a state other than `written` (the
        /// failed one's rename may have landed), so the next commit writes even when it changes
        /// nothing.
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
        /// Whether the writer is in a file write (its system calls may hang on a failing disk).
        var inFileWrite = false
        /// Set by a `stop()` that gave up waiting for a file write (`stopWait`): the writer,
        /// should the write ever return, answers nobody and ends.
        var abandoned = false
    }

    private let batch = Locked(Batch())
    private let queue: DispatchQueue
    /// Signalled once by the `commit` whose write reaches `Batch.gatherTarget`.
    private let gathered = DispatchSemaphore(value: 0)

    /// The least time the writer gathers for (see `writeBatches`).
    private let minimumGathering: Duration
    /// How long `stop()` waits for a file write in progress.
    private let stopWait: Duration
    /// Entered when a work item is enqueued to write batches, left when it ends: what `stop()`
    /// waits on, with a deadline.
    private let running = DispatchGroup()

    /// A store writing to `file`, its batches written by work items on `queue` (a serial queue;
    /// one of its own by default). `minimumGathering` is the least time the writer waits for the
    /// writes of the last batch to come back before it writes the next one (it waits as long as
    /// the last file write took, and ends as soon as they are back): zero by default; tests hold
    /// it open with a long one, so that only the writers' return ends it. `stopWait` is how long
    /// `stop()` waits for a file write in progress (a disk that hangs) before it gives up on it
    /// (issue 42: the process must stop within the engine's grace period, whatever the disk does).
    public init(
        file: StateFile, queue: DispatchQueue = DispatchQueue(label: "forge-push-token.state-file"),
        minimumGathering: Duration = .zero, stopWait: Duration = .milliseconds(200)
    ) {
        self.file = file
        self.queue = queue
        self.minimumGathering = minimumGathering
        self.stopWait = stopWait
    }

    /// Reads the state to start from: the file's contents, or `TokenState.initial` when it does
    /// not exist yet (a first start); the store decides the next write against it, and gives the
    /// next change a version above the file's `tried` too.
    /// - Throws: `StateFile.Failure` when it exists but cannot be read or is not a state file.
    public func load() throws(StateFile.Failure) -> TokenState {
        let contents = try file.load()
        let state = contents.map { TokenState(version: $0.version, token: $0.token) } ?? .initial
        batch.withLock {
            $0.written = state
            $0.tried = contents?.highestTried ?? state.version
        }
        return state
    }

    /// `.storeSerialized`: the store decides every write against its own newest state, and
    /// answers later, after the `fsync` of the batch that holds it.
    public var ordering: CommitOrdering { .storeSerialized }

    /// Proposes `token`; its batch decides it against the last state written, and it completes
    /// once that batch's write is done: `.applied`/`.unchanged` when the file holds it,
    /// `.notSaved` when the write failed, `.versionExhausted` when no version is left. The same
    /// token as the state written, with nothing waiting and the file current, completes at once,
    /// on the caller's thread, and so does a change with no version left; every other outcome
    /// comes on the store's queue, in arrival order. `base` is not needed.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        enum Next {
            case answer(CommitOutcome)
            case wait
            case endGathering
            case write
        }
        let next = batch.withLock { batch -> Next in
            if batch.waiting.isEmpty && !batch.writing && !batch.unsaved {
                if token == batch.written.token { return .answer(.unchanged(batch.written)) }
                if max(batch.tried, batch.written.version) == .max { return .answer(.versionExhausted) }
            }
            batch.waiting.append(Waiting(token: token, completion: completion))
            if let target = batch.gatherTarget, batch.waiting.count >= target {
                batch.gatherTarget = nil
                return .endGathering
            }
            if batch.writing { return .wait }
            batch.writing = true
            running.enter()
            return .write
        }
        switch next {
        case .answer(let outcome): completion(outcome)
        case .wait: break
        case .endGathering: gathered.signal()
        case .write: queue.async { [self] in writeBatches() }
        }
    }

    /// What a batch decided (`decide(_:from:tried:)`): each write's outcome should the file write
    /// succeed, the state to write, and the highest version tried.
    struct Decision: Equatable, Sendable {
        /// Per write, in arrival order: `.applied`, `.unchanged` or `.versionExhausted` (which
        /// stands whatever the file write does).
        var outcomes: [CommitOutcome]
        /// The newest state decided: what the file write holds.
        var state: TokenState
        /// The highest version tried, the batch's included.
        var tried: UInt64
    }

    /// Decides `tokens` (one batch, in arrival order) against `written`, the last state written,
    /// giving each change the version above every version tried so far (`tried`, then the
    /// batch's own): a version once tried is never given to another token. A pure function.
    static func decide(_ tokens: [String?], from written: TokenState, tried: UInt64) -> Decision {
        var state = written
        var highest = max(tried, written.version)
        var outcomes: [CommitOutcome] = []
        outcomes.reserveCapacity(tokens.count)
        for token in tokens {
            if token == state.token {
                outcomes.append(.unchanged(state))
            } else if highest == .max {
                outcomes.append(.versionExhausted)
            } else {
                highest += 1
                state = TokenState(version: highest, token: token)
                outcomes.append(.applied(state))
            }
        }
        return Decision(outcomes: outcomes, state: state, tried: highest)
    }

    /// Writes batches until no write is waiting: each takes every write waiting, decides them and
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
        defer { running.leave() }
        var inFlight = 0
        var lastWrite: Duration = .zero
        while true {
            if inFlight > 0 { gather(inFlight, within: max(lastWrite, minimumGathering)) }
            let (taken, decision, needsWrite) = batch.withLock { batch -> ([Waiting], Decision, Bool) in
                let taken = batch.waiting
                batch.waiting = []
                if taken.isEmpty { batch.writing = false }
                let decision = Self.decide(taken.map(\.token), from: batch.written, tried: batch.tried)
                // Only a batch of refused changes (no version left) with the file current has
                // nothing to write.
                let needsWrite = batch.unsaved || decision.outcomes.contains { $0 != .versionExhausted }
                batch.inFileWrite = needsWrite
                return (taken, decision, needsWrite)
            }
            if taken.isEmpty { return }
            var failure: StateFile.Failure?
            var written: StateFile.Replacement?
            let clock = ContinuousClock()
            let started = clock.now
            if needsWrite {
                let state = decision.state
                let tried = decision.tried > state.version ? decision.tried : nil
                do throws(StateFile.Failure) {
                    // `save(_:)` in its two stages, so that the file can be closed after the answers.
                    let replacement = try file.replace(
                        with: .init(token: state.token, version: state.version, tried: tried))
                    written = replacement
                    try file.flushFolder(of: replacement)
                } catch {
                    failure = error
                }
            }
            lastWrite = clock.now - started
            let arrived = batch.withLock { batch -> Int? in
                batch.inFileWrite = false
                if batch.abandoned {
                    batch.writing = false
                    return nil
                }
                // Tried, whatever came of it: the failed write may be on disk.
                batch.tried = max(batch.tried, decision.tried)
                if needsWrite {
                    batch.unsaved = failure != nil
                    batch.fileWrites &+= 1
                    if failure == nil { batch.written = decision.state }
                }
                return batch.waiting.count
            }
            guard let arrived else {
                // `stop()` gave up on this write and has returned: nobody is answered any more.
                written?.close()
                return
            }
            inFlight = taken.count + arrived
            for (write, outcome) in zip(taken, decision.outcomes) {
                if let failure, outcome != .versionExhausted {
                    write.completion(.notSaved(reason: failure.description))
                } else {
                    write.completion(outcome)
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

    /// Ends a gathering at once (and every later one), waits until every write already waiting
    /// has been written and answered, and closes the last file written. A file write still in
    /// progress after `stopWait` (a disk that hangs) is given up: `stop()` returns, and the
    /// writes of its batch are never answered (the caller stops the process; the HTTP layer has
    /// answered their requests before the store stops). The file then holds the state before
    /// them or, should the write still land, theirs: like any write not acknowledged.
    public func stop() {
        let gathering = batch.withLock { batch in
            batch.stopped = true
            defer { batch.gatherTarget = nil }
            return batch.gatherTarget != nil
        }
        if gathering { gathered.signal() }
        // A `commit` enters `running` under the lock when it starts the writer, so a writer
        // enqueued but not yet run is waited for too.
        let (seconds, attoseconds) = stopWait.components
        let nanoseconds =
            seconds >= Int64.max / 1_000_000_000 ? Int64.max : seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        let limit = DispatchTime.now() + .nanoseconds(Int(clamping: nanoseconds))
        while running.wait(timeout: limit) == .timedOut {
            let gaveUp = batch.withLock { batch in
                if batch.inFileWrite { batch.abandoned = true }
                return batch.abandoned
            }
            if gaveUp { return }
            // Not in a file write: answering or gathering, which end without I/O.
            running.wait()
        }
        queue.sync { keepOpen(nil) }
    }

    deinit {
        batch.withLock { $0.lastWritten }?.close()
    }
}
