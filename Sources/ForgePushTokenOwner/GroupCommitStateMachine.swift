import ForgePushToken

/// The state file's group commit (`StateFileStore`), decided as a value: which write is answered at
/// once, when the writer starts, how long it gathers the next batch, what a batch decides, what
/// each write of it is answered after the file write, and what `stop()` waits for. The store keeps
/// one of these behind its one lock and carries out the actions it returns (start the writer, end
/// a gathering, write the file, answer, close a file) after releasing it.
///
/// The policy (`StateFileStore`'s comment says why): a write that changes nothing with nothing
/// waiting and the file current is answered at once; otherwise it waits, and the first to wait
/// starts the writer. The writer takes every write waiting as one batch, decides it
/// (`StateFileStore.decide(_:from:tried:)`), writes its newest state once and answers the batch. Before taking the
/// next batch it gathers: until as many writes wait as were in flight during the last file write,
/// or for as long as that file write took (at least `minimumGathering`), whichever comes first.
///
/// `Write` is what a waiting write carries (the store's completion; the tests' numbers); `File` is
/// the last file written, kept open until the next one replaced it (`StateFile.Replacement`).
///
/// Thread-safety: a value; the store keeps it behind its lock.
struct GroupCommitStateMachine<Write, File> {
    /// What a `commit` decided.
    enum CommitAction {
        /// Answer it now, on the caller's thread.
        case answer(CommitOutcome)
        /// It waits for the batch the running writer takes next.
        case wait
        /// It waits, and it completes the gathering the writer is in: wake the writer.
        case endGathering
        /// It waits, and no writer runs: start one.
        case startWriter
    }

    /// What the writer does next (`next()`).
    enum WriterAction {
        /// Wait for a `commit` to end the gathering (`CommitAction.endGathering`) or for `limit`
        /// to pass (then `gatheringTimedOut()`), then ask again.
        case gather(within: Duration)
        /// Write `state` to the file (with `tried`, the highest version tried, when above it), then
        /// report with `fileWritten(failure:duration:)`.
        case write(state: TokenState, tried: UInt64?)
        /// Nothing to write (a batch of refused changes, the file current): answer these now.
        case answer([(Write, CommitOutcome)])
        /// No write is waiting: the writer ends.
        case end
    }

    /// What a finished file write decided.
    enum WrittenAction {
        /// Answer each write of the batch; then keep the new file open (`keep(_:)`).
        case answer([(Write, CommitOutcome)])
        /// `stop()` gave up on this write and returned: answer nobody, close the file, end.
        case abandon
    }

    /// The last state written (or read at start): the owner's state, and what the next batch
    /// decides against.
    private(set) var written: TokenState = .initial
    /// The highest version any write has tried (≥ `written.version`): the next change takes one
    /// above it.
    private(set) var tried: UInt64 = 0
    /// Writes waiting for their batch, in arrival order, with their tokens.
    private(set) var waiting: [(write: Write, token: String?)] = []
    /// Whether a writer runs (it takes `waiting` until it is empty).
    private(set) var writing = false
    /// Whether the last write failed: the file may hold a state other than `written` (the failed
    /// one's rename may have landed), so the next commit writes even when it changes nothing.
    private(set) var unsaved = false
    /// Writes of the file (successful or not), each holding one batch.
    private(set) var fileWrites: UInt64 = 0
    /// The batch in the file write, and what it decided.
    private var inWrite: (writes: [Write], decision: StateFileStore.Decision)?
    /// Set after a batch is answered: the gathering the writer does before taking the next one
    /// (the writes in flight during the last file write, and how long it took).
    private var pendingGathering: (target: Int, limit: Duration)?
    /// While the writer gathers: the number of waiting writes at which it goes on at once, told
    /// by the `commit` that reaches it.
    private(set) var gatherTarget: Int?
    /// Set by `stop()`: the writer no longer gathers (nobody is coming back).
    private(set) var stopped = false
    /// Set by a `stop()` that gave up waiting for a file write: the writer, should the write ever
    /// return, answers nobody and ends.
    private(set) var abandoned = false
    /// The last file written, kept open until the next one has replaced it and its batch is
    /// answered (`StateFileStore`'s comment says why).
    private(set) var lastWritten: File?
    /// The least time the writer gathers for.
    let minimumGathering: Duration

    /// A machine that gathers at least `minimumGathering`.
    init(minimumGathering: Duration) {
        self.minimumGathering = minimumGathering
    }

    /// Whether the writer is in a file write (its system calls may hang on a failing disk).
    var inFileWrite: Bool { inWrite != nil }

    /// The state read at start and the highest version the file says was tried.
    mutating func loaded(_ state: TokenState, tried: UInt64) {
        written = state
        self.tried = tried
    }

    /// `write` proposes `token`.
    mutating func commit(_ write: Write, token: String?) -> CommitAction {
        if waiting.isEmpty && !writing && !unsaved {
            if token == written.token { return .answer(.unchanged(written)) }
            if max(tried, written.version) == .max { return .answer(.versionExhausted) }
        }
        waiting.append((write, token))
        if let target = gatherTarget, waiting.count >= target {
            gatherTarget = nil
            return .endGathering
        }
        if writing { return .wait }
        writing = true
        return .startWriter
    }

    /// The writer asks what to do next: gather, write the batch it takes now, or end.
    mutating func next() -> WriterAction {
        if let gathering = pendingGathering {
            pendingGathering = nil
            if waiting.count < gathering.target, !stopped {
                gatherTarget = gathering.target
                return .gather(within: max(gathering.limit, minimumGathering))
            }
        }
        let taken = waiting
        waiting = []
        if taken.isEmpty {
            writing = false
            return .end
        }
        let decision = StateFileStore.decide(taken.map(\.token), from: written, tried: tried)
        let writes = taken.map(\.write)
        // Only a batch of refused changes (no version left) with the file current has nothing to
        // write.
        guard unsaved || decision.outcomes.contains(where: { $0 != .versionExhausted }) else {
            tried = max(tried, decision.tried)
            pendingGathering = (taken.count + waiting.count, .zero)
            return .answer(Array(zip(writes, decision.outcomes)))
        }
        inWrite = (writes, decision)
        let state = decision.state
        return .write(state: state, tried: decision.tried > state.version ? decision.tried : nil)
    }

    /// The gathering's time passed with no `commit` ending it: whether one ended it after all (its
    /// wake-up is coming: the writer takes it, so that the next gathering does not end at once).
    mutating func gatheringTimedOut() -> Bool {
        defer { gatherTarget = nil }
        return gatherTarget == nil
    }

    /// The file write of the batch taken by `next()` ended, after `duration`: `failure` describes
    /// how it failed, `nil` when the file holds the batch's state.
    mutating func fileWritten(failure: String?, duration: Duration) -> WrittenAction {
        guard let (writes, decision) = inWrite else { return .answer([]) }
        inWrite = nil
        if abandoned {
            writing = false
            return .abandon
        }
        // Tried, whatever came of it: the failed write may be on disk.
        tried = max(tried, decision.tried)
        unsaved = failure != nil
        fileWrites &+= 1
        if failure == nil { written = decision.state }
        pendingGathering = (writes.count + waiting.count, duration)
        return .answer(
            zip(writes, decision.outcomes).map { write, outcome in
                if let failure, outcome != .versionExhausted { return (write, .notSaved(reason: failure)) }
                return (write, outcome)
            })
    }

    /// Keeps `file` open as the last file written; returns the one it replaced, to close.
    mutating func keep(_ file: File?) -> File? {
        defer { lastWritten = file }
        return lastWritten
    }

    /// `stop()` began: no gathering any more; returns whether one was in progress (wake the
    /// writer).
    mutating func stop() -> Bool {
        stopped = true
        defer { gatherTarget = nil }
        return gatherTarget != nil
    }

    /// `stop()` waited its time for the writer: whether it gives up (a file write hangs; the
    /// writer will answer nobody). Not in a file write, the writer ends without I/O: wait on.
    mutating func stopTimedOut() -> Bool {
        if inFileWrite { abandoned = true }
        return abandoned
    }
}

extension GroupCommitStateMachine: Sendable where Write: Sendable, File: Sendable {}
extension GroupCommitStateMachine.CommitAction: Sendable where Write: Sendable, File: Sendable {}
extension GroupCommitStateMachine.WriterAction: Sendable where Write: Sendable, File: Sendable {}
extension GroupCommitStateMachine.WrittenAction: Sendable where Write: Sendable, File: Sendable {}
