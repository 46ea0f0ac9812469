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
/// A file write runs in two stages, pipelined on two serial Dispatch queues, so that the next
/// batch's file is written while the previous batch's rename is made durable:
/// 1. the writing queue takes every write decided so far, writes the newest state to the
///    temporary file, flushes it (`fsync`) and renames it over the target
///    (`StateFile.replace(with:)`), then hands the batch on and takes the next;
/// 2. the answering queue flushes the folder (`StateFile.flushFolder(of:)`; one flush for every
///    batch renamed in that folder before it began), then answers the batch's writes, batch after
///    batch in version order. The file a rename replaced stays open until then and is closed on
///    a third serial queue: closing it frees its blocks (on a disk mounted with `discard`, a synchronous
///    request to the disk), which so delays no rename, flush or answer.
///
/// The two stages overlap: batch N+1's temporary file is written and flushed while batch N's
/// folder is flushed and its writes answered, so an answer no longer waits for the whole file
/// write of the batch before it, and the writing queue never waits for answers.
///
/// Renames happen in version order (one queue makes them), and a batch is answered only after a
/// flush of the folder that began after its own rename: what a crash can leave is the previous
/// complete file or a newer one, and never older than anything answered. A work item runs while
/// its stage has work and ends when none is left, so no thread is kept while the store is idle.
///
/// Thread-safety: all members may be called from any thread; the decided state, the batches of
/// both stages and the flags live behind one lock, never held during file I/O or a completion.
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

    /// A batch whose file is written and renamed (or whose write failed), waiting for the folder's
    /// flush and its answers.
    private struct Written {
        /// Its writes, in version order.
        var writes: [Waiting]
        /// The renamed file, or why the write failed.
        var result: Result<StateFile.Replacement, StateFile.Failure>
    }

    /// What the lock guards.
    private struct Batch {
        /// The newest decided state: what the next write decides against, and what the next
        /// batch writes.
        var decided: TokenState = .initial
        /// Writes decided and waiting for their batch, in version order.
        var waiting: [Waiting] = []
        /// Whether a work item of the writing queue is writing batches (it takes `waiting` until
        /// it is empty).
        var writing = false
        /// Batches written and renamed, waiting for the folder's flush and their answers, in
        /// version order.
        var written: [Written] = []
        /// Whether a work item of the answering queue is answering batches (it takes `written`
        /// until it is empty).
        var answering = false
        /// The newest file renamed into place and answered, kept open until a later rename has
        /// replaced it (`StateFile.Replacement`); only the answering queue sets it.
        var current: StateFile.Replacement?
        /// Whether the last write answered failed (the decided state is newer than the file's).
        var unsaved = false
        /// Writes of the file (successful or not), each holding one batch.
        var fileWrites: UInt64 = 0
    }

    private let batch = Locked(Batch())
    private let queue: DispatchQueue
    private let answers: DispatchQueue
    private let closing: DispatchQueue

    /// A store writing to `file`, its batches written by work items on `queue` (a serial queue;
    /// one of its own by default), and their folder flushed and writes answered on a serial queue
    /// of its own (a third one closes the files replaced).
    public init(file: StateFile, queue: DispatchQueue = DispatchQueue(label: "forge-push-token.state-file")) {
        self.file = file
        self.queue = queue
        self.answers = DispatchQueue(label: "forge-push-token.state-file.answers")
        self.closing = DispatchQueue(label: "forge-push-token.state-file.close")
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
    /// token with nothing waiting, nothing being written and the file current completes at once,
    /// on the caller's thread; every other outcome comes on the store's answering queue, in
    /// version order.
    public func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        enum Next {
            case answer(CommitOutcome)
            case wait
            case write
        }
        let next = batch.withLock { batch -> Next in
            let changed = token != batch.decided.token
            if changed && batch.decided.version == .max { return .answer(.versionExhausted) }
            let idle = batch.waiting.isEmpty && !batch.writing && !batch.answering
            if !changed && idle && !batch.unsaved {
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

    /// The first stage, on `queue`: writes batches until no write is waiting. Each takes every
    /// write decided so far, writes and renames the newest state once, and is handed to the
    /// answering queue.
    private func writeBatches() {
        while true {
            let (taken, state) = batch.withLock { batch -> ([Waiting], TokenState) in
                let taken = batch.waiting
                batch.waiting = []
                if taken.isEmpty { batch.writing = false }
                return (taken, batch.decided)
            }
            if taken.isEmpty { return }
            let result: Result<StateFile.Replacement, StateFile.Failure>
            do throws(StateFile.Failure) {
                result = .success(try file.replace(with: .init(token: state.token, version: state.version)))
            } catch {
                result = .failure(error)
            }
            let startAnswering = batch.withLock { batch -> Bool in
                batch.written.append(Written(writes: taken, result: result))
                if batch.answering { return false }
                batch.answering = true
                return true
            }
            if startAnswering { answers.async { [self] in answerBatches() } }
        }
    }

    /// The second stage, on `answers`: until no batch is written, takes every batch written so
    /// far, flushes each folder they were renamed in once, answers their writes in version order,
    /// and then closes the files the renames replaced.
    private func answerBatches() {
        while true {
            let done = batch.withLock { batch -> [Written] in
                let done = batch.written
                batch.written = []
                if done.isEmpty { batch.answering = false }
                return done
            }
            if done.isEmpty { return }
            // Every rename of `done` happened before this flush begins: one flush of a folder
            // makes all of them durable (the last batch's, in the usual case of one folder).
            var flushed: [(StateFile.FileIdentity, StateFile.Failure?)] = []
            var failures: [StateFile.Failure?] = []
            for written in done {
                switch written.result {
                case .failure(let failure):
                    failures.append(failure)
                case .success(let replacement):
                    if let known = flushed.first(where: { $0.0 == replacement.folderIdentity }) {
                        failures.append(known.1)
                        continue
                    }
                    let failure: StateFile.Failure?
                    do throws(StateFile.Failure) {
                        try file.flushFolder(of: replacement)
                        failure = nil
                    } catch {
                        failure = error
                    }
                    flushed.append((replacement.folderIdentity, failure))
                    failures.append(failure)
                }
            }
            let replaced = batch.withLock { batch -> [StateFile.Replacement] in
                batch.unsaved = (failures.last ?? nil) != nil
                batch.fileWrites &+= UInt64(done.count)
                var replaced: [StateFile.Replacement] = []
                for written in done {
                    guard case .success(let replacement) = written.result else { continue }
                    if let current = batch.current { replaced.append(current) }
                    batch.current = replacement
                }
                return replaced
            }
            for (written, failure) in zip(done, failures) {
                for write in written.writes {
                    if let failure {
                        write.completion(.notSaved(write.state, changed: write.changed, reason: failure.description))
                    } else {
                        write.completion(write.changed ? .applied(write.state) : .unchanged(write.state))
                    }
                }
            }
            // Closing a replaced file frees its blocks (on a disk mounted with `discard`, a
            // synchronous request to the disk): done aside, so that it delays no flush or answer.
            if !replaced.isEmpty {
                closing.async {
                    for replacement in replaced { replacement.close() }
                }
            }
        }
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

    /// Waits until every write already decided has been written and answered and every file
    /// they replaced closed, then closes the file kept open (the one in place stays): no
    /// descriptor of the store's is left open.
    public func stop() {
        queue.sync {}
        answers.sync {}
        closing.sync {}
        batch.withLock { batch -> StateFile.Replacement? in
            defer { batch.current = nil }
            return batch.current
        }?.close()
    }
}
