import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import Testing

/// `TokenStore`'s one commit (`commit(_:base:completion:)`) as the owner drives it: a store that
/// answers before returning is read through the owner's `OutcomeSlot`, and its contract is
/// checked.
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
                let outcome = owner.commit(token) {
                    Issue.record("a store that answers at once was asked for a later completion")
                    return { _ in }
                }
                guard case .applied(let state) = outcome, state.token == token else {
                    Issue.record("write \(token) gave \(String(describing: outcome))")
                    continue
                }
                versions.withLock { $0.append(state.version) }
            }
        }
        #expect(versions.withLock { $0.sorted() } == Array(1...UInt64(threads * each)))
        #expect(owner.version == UInt64(threads * each))
    }

    // Exit tests need Swift 6.2 and a platform that can spawn the test process.
    #if compiler(>=6.2) && os(Linux)
        @Test("an owner-serialized store that does not complete before returning stops the process")
        func aStoreThatAnswersLaterThanItSaidStops() async {
            await #expect(processExitsWith: .failure) {
                let owner = TokenOwner<TokenState>(
                    store: BrokenStore(completions: 0), initial: .initial, maxSubscribers: 1)
                _ = owner.commit("ab") { { _ in } }
            }
        }

        @Test("an owner-serialized store that completes one commit twice stops the process")
        func aStoreThatCompletesTwiceStops() async {
            await #expect(processExitsWith: .failure) {
                let owner = TokenOwner<TokenState>(
                    store: BrokenStore(completions: 2), initial: .initial, maxSubscribers: 1)
                _ = owner.commit("ab") { { _ in } }
            }
        }
    #endif
}

/// An `.ownerSerialized` store that breaks its contract: it calls the completion `completions`
/// times (0 or 2) before returning, instead of once.
final class BrokenStore: TokenStore {
    let completions: Int
    init(completions: Int) { self.completions = completions }
    var ordering: CommitOrdering { .ownerSerialized }
    func commit(_ token: String?, base: TokenState, completion: @escaping @Sendable (CommitOutcome) -> Void) {
        for _ in 0..<completions { completion(.applied(base.changed(to: token))) }
    }
    func start(
        reporting report: @escaping @Sendable (TokenStoreEvent) -> Void,
        current: @escaping @Sendable () -> TokenState
    ) {}
    func stop() {}
}
