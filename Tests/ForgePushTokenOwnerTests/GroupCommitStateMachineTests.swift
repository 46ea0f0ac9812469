import ForgePushToken
import ForgePushTokenTestSupport
import Testing

@testable import ForgePushTokenOwner

/// Issue 43: the state file's group commit (`GroupCommitStateMachine`) as a value: when a write is
/// answered at once, when the writer starts, how it gathers, what a batch writes and answers, and
/// what `stop()` waits for, with no file, no queue and no thread.
@Suite struct GroupCommitStateMachineTests {
    typealias Machine = GroupCommitStateMachine<Int, String>

    private static let a = TokenState(version: 1, token: "aa")

    /// A machine that holds `a`, as read at start.
    private static func loaded(minimumGathering: Duration = .zero) -> Machine {
        var machine = Machine(minimumGathering: minimumGathering)
        machine.loaded(a, tried: 1)
        return machine
    }

    /// The answers of a writer action (`.answer`), as (write, outcome) pairs.
    private static func answers(_ action: Machine.WrittenAction) -> [Answer] {
        guard case .answer(let list) = action else { return [] }
        return list.map { Answer(write: $0.0, outcome: $0.1) }
    }

    /// Expects `action` to be the case named `name` (`startWriter`, `write`, …), whatever its
    /// values; `why` says what it means when it is not.
    private static func expect(
        _ action: some Any, is name: String, _ why: Comment, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let step = String(String(describing: action).prefix { $0 != "(" })
        #expect(step == name, why, sourceLocation: sourceLocation)
    }

    /// One answer, comparable.
    struct Answer: Equatable {
        var write: Int
        var outcome: CommitOutcome
    }

    @Test func aWriteThatChangesNothingIsAnsweredAtOnce() {
        var machine = Self.loaded()
        guard case .answer(.unchanged(let state)) = machine.commit(1, token: "aa") else {
            Issue.record("the current token was not answered at once")
            return
        }
        #expect(state == Self.a)
        #expect(!machine.writing && machine.waiting.isEmpty)
    }

    @Test func aChangeStartsTheWriterAndTheNextOnesWait() {
        var machine = Self.loaded()
        Self.expect(machine.commit(1, token: "bb"), is: "startWriter", "the first change did not start the writer")
        Self.expect(machine.commit(2, token: "cc"), is: "wait", "a change while the writer runs did not wait")
        // While the writer runs, even the current token waits: it is decided in its batch.
        Self.expect(
            machine.commit(3, token: "aa"), is: "wait",
            "a write of the current token did not wait for the running writer")
        guard case .write(let state, let tried) = machine.next() else {
            Issue.record("the writer did not write the batch")
            return
        }
        #expect(state == TokenState(version: 4, token: "aa") && tried == nil)
        #expect(machine.inFileWrite && machine.waiting.isEmpty)
        #expect(
            Self.answers(machine.fileWritten(failure: nil, duration: .milliseconds(1))) == [
                Answer(write: 1, outcome: .applied(TokenState(version: 2, token: "bb"))),
                Answer(write: 2, outcome: .applied(TokenState(version: 3, token: "cc"))),
                Answer(write: 3, outcome: .applied(TokenState(version: 4, token: "aa"))),
            ])
        #expect(machine.written == TokenState(version: 4, token: "aa") && machine.fileWrites == 1)
    }

    /// After a batch, the writer gathers until as many writes wait as were in flight during its
    /// file write, for at most as long as that write took (at least `minimumGathering`); the
    /// `commit` that reaches the target ends it.
    @Test func theWriterGathersAsManyWritesAsWereInFlight() {
        var machine = Self.loaded(minimumGathering: .milliseconds(2))
        _ = machine.commit(1, token: "bb")
        _ = machine.commit(2, token: "cc")
        _ = machine.next()
        // One arrives during the file write: three were in flight.
        _ = machine.commit(3, token: "dd")
        _ = machine.fileWritten(failure: nil, duration: .milliseconds(5))
        guard case .gather(let limit) = machine.next() else {
            Issue.record("the writer did not gather")
            return
        }
        #expect(limit == .milliseconds(5) && machine.gatherTarget == 3)
        Self.expect(machine.commit(4, token: "ee"), is: "wait", "the second of three ended the gathering")
        Self.expect(machine.commit(5, token: "ff"), is: "endGathering", "the third of three did not end the gathering")
        #expect(machine.gatherTarget == nil)
        guard case .write(let state, _) = machine.next() else {
            Issue.record("the gathered batch was not written")
            return
        }
        #expect(state == TokenState(version: 6, token: "ff"))
        // A fast write gathers for the minimum.
        _ = machine.fileWritten(failure: nil, duration: .microseconds(10))
        guard case .gather(let shortest) = machine.next() else {
            Issue.record("the writer did not gather after the second batch")
            return
        }
        #expect(shortest == .milliseconds(2))
        // Nobody came: the time passes, no `commit` ended it, and the writer ends.
        let endedByACommit = machine.gatheringTimedOut()
        #expect(!endedByACommit)
        Self.expect(machine.next(), is: "end", "the writer did not end with nothing waiting")
        #expect(!machine.writing)
    }

    /// A `commit` that ends the gathering between the timeout and the writer's lock: the writer
    /// learns that a wake-up is coming, to take it.
    @Test func aGatheringEndedAfterItsTimeIsReported() {
        var machine = Self.loaded()
        _ = machine.commit(1, token: "bb")
        _ = machine.next()
        _ = machine.commit(2, token: "cc")
        _ = machine.fileWritten(failure: nil, duration: .milliseconds(1))
        Self.expect(machine.next(), is: "gather", "the writer did not gather")
        Self.expect(machine.commit(3, token: "dd"), is: "endGathering", "the second write did not end the gathering")
        let late = machine.gatheringTimedOut()
        #expect(late)
    }

    /// A failed file write: every change of the batch is `.notSaved`, the state written stays,
    /// and the next write of the current token is written (the file may hold the failed state),
    /// at a version above the one tried.
    @Test func aFailedWriteAnswersNotSavedAndKeepsTheVersionTried() {
        var machine = Self.loaded()
        _ = machine.commit(1, token: "bb")
        _ = machine.next()
        #expect(
            Self.answers(machine.fileWritten(failure: "disk full", duration: .zero)) == [
                Answer(write: 1, outcome: .notSaved(reason: "disk full"))
            ])
        #expect(machine.written == Self.a && machine.unsaved && machine.tried == 2 && machine.fileWrites == 1)
        Self.expect(machine.next(), is: "gather", "the writer did not gather after the failed write")
        let endedLate = machine.gatheringTimedOut()
        #expect(!endedLate)
        Self.expect(machine.next(), is: "end", "the writer did not end")
        Self.expect(
            machine.commit(2, token: "aa"), is: "startWriter",
            "after a failed write, the current token was answered without a write")
        guard case .write(let state, let tried) = machine.next() else {
            Issue.record("the current token was not written after a failed write")
            return
        }
        #expect(state == Self.a && tried == 2)
        #expect(
            Self.answers(machine.fileWritten(failure: nil, duration: .zero)) == [
                Answer(write: 2, outcome: .unchanged(Self.a))
            ])
        #expect(!machine.unsaved)
    }

    /// No version left: a change is refused at once; in a batch, with the file current, nothing
    /// is written and the batch is answered as decided.
    @Test func noVersionLeft() {
        var machine = Machine(minimumGathering: .zero)
        let top = TokenState(version: .max, token: "aa")
        machine.loaded(top, tried: .max)
        guard case .answer(.versionExhausted) = machine.commit(1, token: "bb") else {
            Issue.record("a change with no version left was not refused at once")
            return
        }
        var running = Machine(minimumGathering: .zero)
        running.loaded(TokenState(version: .max - 1, token: "aa"), tried: .max - 1)
        _ = running.commit(1, token: "bb")
        _ = running.next()
        _ = running.commit(2, token: "cc")
        _ = running.fileWritten(failure: nil, duration: .zero)
        Self.expect(running.next(), is: "gather", "the writer did not gather")
        _ = running.gatheringTimedOut()
        guard case .answer(let refused) = running.next() else {
            Issue.record("a batch of refused changes was written")
            return
        }
        #expect(refused.map(\.0) == [2] && refused.map(\.1) == [.versionExhausted])
        #expect(running.fileWrites == 1 && !running.inFileWrite)
    }

    /// `stop()` ends a gathering and every later one, and gives up only on a file write in
    /// progress, whose batch is then answered by nobody.
    @Test func stopEndsGatheringAndAbandonsOnlyAFileWrite() {
        var machine = Self.loaded()
        _ = machine.commit(1, token: "bb")
        _ = machine.next()
        _ = machine.commit(2, token: "cc")
        _ = machine.fileWritten(failure: nil, duration: .seconds(1))
        Self.expect(machine.next(), is: "gather", "the writer did not gather")
        let wasGathering = machine.stop()
        #expect(wasGathering)
        // Not in a file write: `stop()` waits on.
        let gaveUpWhileGathering = machine.stopTimedOut()
        #expect(!gaveUpWhileGathering)
        Self.expect(machine.next(), is: "write", "the waiting write was not written after stop")
        // Taken at once after stop (no gathering); its file write hangs: `stop()` gives up.
        _ = machine.commit(3, token: "dd")
        let gaveUp = machine.stopTimedOut()
        #expect(gaveUp)
        Self.expect(
            machine.fileWritten(failure: nil, duration: .zero), is: "abandon",
            "a write abandoned by stop() was answered")
        #expect(!machine.writing)
    }

    @Test func theLastFileIsKeptUntilTheNextReplacesIt() {
        var machine = Self.loaded()
        let none = machine.keep("first")
        #expect(none == nil)
        let first = machine.keep("second")
        #expect(first == "first")
        let second = machine.keep(nil)
        #expect(second == "second")
        #expect(machine.lastWritten == nil)
    }

    /// Every write is answered exactly once, versions never repeat, and the state written is the
    /// newest applied, over a seeded random interleaving of commits, file writes (failing or not)
    /// and gatherings.
    @Test func everyWriteIsAnsweredOnceInASeededRun() {
        var generator = SeededGenerator(state: 43)
        for _ in 0..<300 {
            var machine = Self.loaded()
            var answered: [Int: CommitOutcome] = [:]
            var versions = Set<UInt64>()
            var next = 0
            var writerRunning = false
            var inWrite = false
            func record(_ write: Int, _ outcome: CommitOutcome) {
                #expect(answered[write] == nil, "write \(write) answered twice")
                answered[write] = outcome
                if case .applied(let state) = outcome {
                    #expect(versions.insert(state.version).inserted, "version \(state.version) given twice")
                }
            }
            // One step of the writer: end its file write (failing it when `failing`), or ask it
            // what comes next.
            func writerStep(failing: Bool) {
                if inWrite {
                    if case .answer(let list) = machine.fileWritten(failure: failing ? "failed" : nil, duration: .zero)
                    {
                        for (write, outcome) in list { record(write, outcome) }
                    }
                    inWrite = false
                    return
                }
                switch machine.next() {
                case .end: writerRunning = false
                case .gather: _ = machine.gatheringTimedOut()
                case .answer(let list): for (write, outcome) in list { record(write, outcome) }
                case .write: inWrite = true
                }
            }
            for _ in 0..<60 {
                if !writerRunning || Bool.random(using: &generator) {
                    next += 1
                    let token = ["aa", "bb", "cc"].randomElement(using: &generator)!
                    switch machine.commit(next, token: token) {
                    case .answer(let outcome): record(next, outcome)
                    case .startWriter: writerRunning = true
                    case .wait, .endGathering: break
                    }
                } else {
                    writerStep(failing: Int.random(in: 0..<5, using: &generator) == 0)
                }
            }
            // Drain: the writer runs until nothing waits.
            while writerRunning { writerStep(failing: false) }
            #expect(answered.count == next, "\(next) writes, \(answered.count) answered")
            #expect(!machine.writing && machine.waiting.isEmpty)
        }
    }
}
