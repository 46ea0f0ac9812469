import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import Foundation
import Testing

/// The state machine's kept list of subscribers (`listed`): every list it hands out
/// (deliveries, heartbeat, stop, finishIfDrained, abortAll, everySubscriber) is exactly the
/// subscribers of that moment, over random runs of joins, leaves and changes; and, through the
/// owner, with threads joining, leaving and committing at once.
@Suite("The owner's kept list of subscribers")
struct SubscriberListTests {
    typealias Machine = TokenOwnerStateMachine<TokenState>

    static func ids(_ list: [Machine.Subscriber]) -> [UInt64] { list.map(\.id).sorted() }

    @Test(
        "random joins, leaves (known and unknown), refusals, changes, commits in flight and stops: every list handed out is the subscribers of that moment, each once"
    )
    func everyListIsCurrent() {
        for seed in UInt64(1)...200 {
            var random = SeededGenerator(state: seed)
            let limit = Int.random(in: 1...6, using: &random)
            var machine = Machine(initial: .initial, maxSubscribers: limit)
            var model: Set<UInt64> = []
            var version: UInt64 = 0
            var kept: [(ids: [UInt64], list: [Machine.Subscriber])] = []
            func check(_ list: [Machine.Subscriber], _ what: String) -> Bool {
                let got = Self.ids(list)
                if got != model.sorted() {
                    Issue.record("seed \(seed): \(what) gave \(got), subscribers are \(model.sorted())")
                    return false
                }
                kept.append((got, list))
                return true
            }
            steps: for _ in 0..<120 {
                switch Int.random(in: 0..<100, using: &random) {
                case 0..<20:
                    switch machine.subscribe({ id, first in RecordingSubscriber(id: id, first: first) }) {
                    case .success(let subscriber): model.insert(subscriber.id)
                    case .failure(let refusal):
                        #expect(refusal == (machine.isStopping ? .stopping : .full), "seed \(seed)")
                        #expect(machine.isStopping || model.count == limit, "seed \(seed)")
                    }
                case 20..<32:
                    // A known id, or one that never was / already left.
                    let id =
                        model.isEmpty || Bool.random(using: &random)
                        ? UInt64.random(in: 0...40, using: &random) : model.randomElement(using: &random)!
                    machine.unsubscribe(id)
                    model.remove(id)
                case 32..<52:
                    version += UInt64.random(in: 0...2, using: &random)  // 0: not newer, nothing
                    let state = TokenState(version: version, token: String(version))
                    let delivery =
                        Bool.random(using: &random)
                        ? machine.committed(.applied(state)) : machine.storeReported(.changed(state))
                    if let delivery {
                        if model.isEmpty { Issue.record("seed \(seed): a delivery to nobody") }
                        if !check(delivery.subscribers, "delivery") { break steps }
                    }
                case 52..<60:
                    if !check(machine.heartbeat(), "heartbeat") { break steps }
                case 60..<68:
                    if !check(machine.everySubscriber(), "everySubscriber") { break steps }
                case 68..<74:
                    if !check(machine.abortAll(), "abortAll") { break steps }
                case 74..<82:
                    _ = machine.beginCommit()
                case 82..<88:
                    _ = machine.committed(.unchanged(machine.current))
                    let drained = machine.finishIfDrained()
                    if !drained.isEmpty, !check(drained, "finishIfDrained") { break steps }
                case 88..<91:
                    let wasStopping = machine.isStopping
                    let finishing = machine.stop()
                    if !wasStopping && machine.commitsInFlight == 0 {
                        if !check(finishing, "stop") { break steps }
                    } else if !finishing.isEmpty {
                        Issue.record("seed \(seed): stop() handed out \(Self.ids(finishing)) while it should not")
                        break steps
                    }
                default:
                    if let id = model.randomElement(using: &random) {
                        #expect(machine.subscriber(id)?.id == id, "seed \(seed)")
                    }
                    #expect(machine.subscriberCount == model.count, "seed \(seed)")
                    #expect(machine.subscriberIDs.sorted() == model.sorted(), "seed \(seed)")
                }
            }
            // Every list handed out still holds what it held when handed out.
            for (ids, list) in kept where Self.ids(list) != ids {
                Issue.record("seed \(seed): a list handed out changed from \(ids) to \(Self.ids(list))")
            }
        }
    }

    @Test(
        "threads joining, leaving, committing, ticking and picking at once: a joined subscriber gets every change committed after it joined; a departed one gets none applied after it left"
    )
    func joinsAndLeavesRaceDeliveries() {
        let owner = TokenOwner<TokenState>(store: ScriptedStore(), initial: .initial, maxSubscribers: 64)
        owner.start()
        let stop = Locked(false)
        let failures = Locked<[String]>([])
        let group = DispatchGroup()
        // Committers: a change each time (distinct tokens).
        for committer in 0..<2 {
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                var round = 0
                while !stop.withLock({ $0 }) {
                    round += 1
                    _ = commitAtOnce(owner, "c\(committer)-\(round)")
                }
            }
        }
        // Heartbeats and finish(where:) that picks nobody: they walk the list too.
        group.enter()
        Thread.detachNewThread {
            defer { group.leave() }
            while !stop.withLock({ $0 }) {
                owner.heartbeat()
                owner.finish(reason: .revoked) { _ in false }
            }
        }
        let churners = DispatchGroup()
        for churner in 0..<2 {
            churners.enter()
            Thread.detachNewThread {
                defer { churners.leave() }
                var departed: [(RecordingSubscriber, UInt64)] = []
                for round in 0..<1_500 {
                    let subscription: TokenOwner<TokenState>.Subscription<RecordingSubscriber>
                    do {
                        subscription = try owner.subscribe { id, first in RecordingSubscriber(id: id, first: first) }
                    } catch {
                        failures.withLock { $0.append("refused: \(error)") }
                        return
                    }
                    let subscriber = subscription.subscriber
                    // A change begun after the join reaches it (or a newer one does) before commit returns.
                    if case .applied(let state) = commitAtOnce(owner, "j\(churner)-\(round)") {
                        let newest = subscriber.offered.last!.version
                        if newest < state.version {
                            failures.withLock {
                                $0.append(
                                    "joined \(subscriber.id): committed \(state.version), newest offered \(newest)")
                            }
                        }
                    }
                    subscription.cancel()
                    departed.append((subscriber, owner.version))
                }
                // Let the committers apply more changes after the last leave, then check.
                let target = owner.version + 20
                guard waitUntil("the committers to reach version \(target)", { owner.version >= target }) else {
                    return
                }
                for (subscriber, atLeave) in departed {
                    let newest = subscriber.offered.last!.version
                    if newest > atLeave {
                        failures.withLock {
                            $0.append("left \(subscriber.id) at version \(atLeave), offered \(newest) after")
                        }
                    }
                }
            }
        }
        churners.wait()
        stop.withLock { $0 = true }
        group.wait()
        let found = failures.withLock { $0 }
        #expect(found.isEmpty, "\(found.count) failures: \(found.prefix(10))")
        #expect(owner.subscriberIDs.isEmpty)
    }
}
