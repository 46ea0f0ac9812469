import Dispatch
import ForgePushToken
import ForgePushTokenOwnerTestSupport
import Testing

@testable import ForgePushTokenOwner

/// `TokenStore`'s one commit (`commit(_:base:completion:)`) as the owner drives it: a store that
/// decides before returning returns the outcome, and the owner's commit returns it decided
/// (`CommitResult.decided`); a store that breaks that contract changes nothing and crashes nothing.
@Suite("One commit path")
struct OneCommitPathTests {
    @Test("concurrent writers on an owner-serialized store: every write its own version, none lost")
    func concurrentWritersGetDistinctVersions() {
        let owner = TokenOwner<TokenState>(store: MemoryTokenStore(), initial: .initial, maxSubscribers: 1)
        let versions = Locked<[UInt64]>([])
        let threads = 4
        let each = 500
        DispatchQueue.concurrentPerform(iterations: threads) { thread in
            for index in 0..<each {
                let token = String(thread * each + index + 0x100, radix: 16)
                let result = owner.commit(token)
                guard case .decided(.applied(let state)) = result, state.token == token else {
                    Issue.record("write \(token) gave \(String(describing: result))")
                    continue
                }
                versions.withLock { $0.append(state.version) }
            }
        }
        #expect(versions.withLock { $0.sorted() } == Array(1...UInt64(threads * each)))
        #expect(owner.version == UInt64(threads * each))
    }

    @Test("an owner-serialized store that does not decide before returning: unknown, nothing applied")
    func aStoreThatAnswersLaterThanItSaid() {
        let owner = TokenOwner<TokenState>(store: BrokenStore(), initial: .initial, maxSubscribers: 1)
        guard case .decided(.unknown) = owner.commit("ab") else {
            Issue.record("a store that broke its contract was not answered unknown")
            return
        }
        // Its late completion (called twice) changed nothing, and the next commit is asked.
        #expect(owner.version == 0 && owner.machine.withLock { $0.commitsInFlight } == 0)
        guard case .decided(.unknown) = owner.commit("cd") else {
            Issue.record("the second commit was not asked")
            return
        }
    }

    @Test("a store that decides later: pending, applied before the caller hears of it")
    func aPendingCommitIsAppliedFirst() {
        let store = ScriptedStore(answering: .whenReleased)
        let owner = TokenOwner<TokenState>(store: store, initial: .initial, maxSubscribers: 1)
        guard case .pending(let pending) = owner.commit("ab") else {
            Issue.record("a store that decides later was answered at once")
            return
        }
        let heard = Locked<(CommitOutcome, UInt64)?>(nil)
        #expect(pending.outcome(orWhenDecided: { outcome in heard.withLock { $0 = (outcome, owner.version) } }) == nil)
        #expect(store.release())
        #expect(heard.withLock { $0?.0 } == .applied(TokenState(version: 1, token: "ab")))
        #expect(heard.withLock { $0?.1 } == 1, "the caller heard of the outcome before the owner applied it")
        // Taken once: a second caller hears nothing.
        #expect(pending.outcome(orWhenDecided: { _ in Issue.record("a taken outcome was given twice") }) == nil)
    }

    @Test("a pending commit decided before its caller looks: returned, and the closure is not kept")
    func aPendingCommitDecidedFirst() {
        let store = ScriptedStore(answering: .whenReleased)
        let owner = TokenOwner<TokenState>(store: store, initial: .initial, maxSubscribers: 1)
        guard case .pending(let pending) = owner.commit("ab") else {
            Issue.record("a store that decides later was answered at once")
            return
        }
        #expect(store.release())
        let outcome = pending.outcome(orWhenDecided: { _ in Issue.record("a decided outcome was given later") })
        #expect(outcome == .applied(TokenState(version: 1, token: "ab")))
    }
}

/// An `.ownerSerialized` store that breaks its contract: it returns `nil` instead of the outcome,
/// and calls the completion twice instead.
final class BrokenStore: TokenStore {
    var ordering: CommitOrdering { .ownerSerialized }
    func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void)
        -> CommitOutcome?
    {
        for _ in 0..<2 { completion(.applied(base.changed(to: token))) }
        return nil
    }
    func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {}
    func stop() {}
}
