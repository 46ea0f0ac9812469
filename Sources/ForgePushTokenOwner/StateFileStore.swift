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

    /// The group commit's state and policy (`GroupCommitStateMachine`): the state written, the
    /// waiting writes (each with its completion) and the flags. The one lock of the store.
    private let batch: Locked<GroupCommitStateMachine<Waiting, StateFile.Replacement>>

    /// One write waiting for the batch that decides it and the `fsync` that holds it: its
    /// completion, in a struct so that the machine's generic storage holds it as it was made
    /// (a bare closure as a generic argument is wrapped in a reabstraction thunk on the way in
    /// and out: `ClosureBox` in RedisLink.swift tells what that cost once).
    private struct Waiting: Sendable {
        /// Receives the outcome.
        var completion: @Sendable (CommitOutcome) -> Void
    }
    private let queue: DispatchQueue
    /// Signalled once by the `commit` whose write ends a gathering (`CommitAction.endGathering`).
    private let gathered = DispatchSemaphore(value: 0)

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
        self.batch = Locked(GroupCommitStateMachine(minimumGathering: minimumGathering))
        self.stopWait = stopWait
    }

    /// Reads the state to start from: the file's contents, or `TokenState.initial` when it does
    /// not exist yet (a first start); the store decides the next write against it, and gives the
    /// next change a version above the file's `tried` too.
    /// - Throws: `StateFile.Failure` when it exists but cannot be read or is not a state file.
    public func load() throws(StateFile.Failure) -> TokenState {
        let contents = try file.load()
        let state = contents.map { TokenState(version: $0.version, token: $0.token) } ?? .initial
        batch.withLock { $0.loaded(state, tried: contents?.highestTried ?? state.version) }
        return state
    }

    /// `.storeSerialized`: the store decides every write against its own newest state, and
    /// answers later, after the `fsync` of the batch that holds it.
    public var ordering: CommitOrdering { .storeSerialized }

    /// Proposes `token`; its batch decides it against the last state written, and it completes
    /// once that batch's write is done: `.applied`/`.unchanged` when the file holds it,
    /// `.notSaved` when the write failed, `.versionExhausted` when no version is left. The same
    /// token as the state written, with nothing waiting and the file current, is returned at once,
    /// and so is a change with no version left; every other outcome goes to `completion`, on the
    /// store's queue, in arrival order. `base` is not needed.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?
    {
        let action = batch.withLock { machine in
            let action = machine.commit(Waiting(completion: completion), token: token)
            // Entered under the lock, so that a `stop()` that follows waits for this writer too.
            if case .startWriter = action { running.enter() }
            return action
        }
        switch action {
        case .answer(let outcome): return outcome
        case .wait: break
        case .endGathering: gathered.signal()
        case .startWriter: queue.async { [self] in writeBatches() }
        }
        return nil
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

    /// Writes batches until no write is waiting, as `GroupCommitStateMachine.next()` says: each
    /// takes every write waiting, decides them and writes the newest state once.
    ///
    /// Before taking the next batch, the writer gathers: it waits until as many writes wait as
    /// were in flight during the last file write (those it answered and those that arrived
    /// meanwhile), or for as long as that file write took, whichever comes first. Without it,
    /// clients that write again as soon as they are answered split into two groups that alternate,
    /// each waiting for the other's file write and then its own: half of them per `fsync` (about
    /// 30 of 64 connections here), two file writes per request. Gathered, one `fsync` carries them
    /// all. Bounded by the last file write's duration, the wait at most doubles a write's latency
    /// when the clients do not come back (PostgreSQL's `commit_delay` makes the same trade, with a
    /// fixed delay).
    private func writeBatches() {
        defer { running.leave() }
        while true {
            switch batch.withLock({ $0.next() }) {
            case .end:
                return
            case .gather(let limit):
                gather(within: limit)
            case .answer(let answers):
                for (write, outcome) in answers { write.completion(outcome) }
            case .write(let state, let tried):
                let clock = ContinuousClock()
                let started = clock.now
                var failure: StateFile.Failure?
                var written: StateFile.Replacement?
                do throws(StateFile.Failure) {
                    // `save(_:)` in its two stages, so that the file can be closed after the answers.
                    let replacement = try file.replace(
                        with: .init(token: state.token, version: state.version, tried: tried))
                    written = replacement
                    try file.flushFolder(of: replacement)
                } catch {
                    failure = error
                }
                let duration = clock.now - started
                switch batch.withLock({ $0.fileWritten(failure: failure?.description, duration: duration) }) {
                case .abandon:
                    // `stop()` gave up on this write and has returned: nobody is answered any more.
                    written?.close()
                    return
                case .answer(let answers):
                    for (write, outcome) in answers { write.completion(outcome) }
                    if let written { keepOpen(written) }
                }
            }
        }
    }

    /// Waits until a `commit` ends the gathering or `limit` has passed (see `writeBatches`).
    private func gather(within limit: Duration) {
        if gathered.wait(timeout: .now() + Self.dispatchInterval(limit)) == .success { return }
        // A `commit` ended it after the timeout and before the lock: its signal is coming; take
        // it, so that the next gathering does not end at once.
        if batch.withLock({ $0.gatheringTimedOut() }) { gathered.wait() }
    }

    /// `duration` for Dispatch, saturated: a duration past Int64's nanoseconds (292 years) waits
    /// "forever".
    private static func dispatchInterval(_ duration: Duration) -> DispatchTimeInterval {
        let (seconds, attoseconds) = duration.components
        let nanoseconds =
            seconds >= Int64.max / 1_000_000_000 ? Int64.max : seconds * 1_000_000_000 + attoseconds / 1_000_000_000
        return .nanoseconds(Int(clamping: nanoseconds))
    }

    /// Keeps `written` open as the last file written and closes the one it replaced (on the
    /// store's queue, after that batch's answers).
    private func keepOpen(_ written: StateFile.Replacement?) {
        batch.withLock { $0.keep(written) }?.close()
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
        if batch.withLock({ $0.stop() }) { gathered.signal() }
        // A `commit` enters `running` under the lock when it starts the writer, so a writer
        // enqueued but not yet run is waited for too.
        let limit = DispatchTime.now() + Self.dispatchInterval(stopWait)
        while running.wait(timeout: limit) == .timedOut {
            if batch.withLock({ $0.stopTimedOut() }) { return }
            // Not in a file write: answering or gathering, which end without I/O.
            running.wait()
        }
        queue.sync { keepOpen(nil) }
    }

    deinit {
        batch.withLock { $0.lastWritten }?.close()
    }
}
