import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// The subscribers of `GET /token/stream` and the owner's fan-out to them: a `TokenOwner` over a
/// `ScriptedStore`, whose `report(.changed(_:))` plays a change made elsewhere (another replica).
@Suite("TokenOwner fan-out to EventSubscribers")
struct FanOutTests {
    typealias Refusal = TokenOwnerStateMachine<TokenSnapshot>.Refusal
    typealias Owner = TokenOwner<TokenSnapshot>

    /// A subscriber with its wake counter.
    struct Client {
        let subscriber: EventSubscriber
        let wakes: Counter
    }

    /// A started owner at the initial state, and its store.
    static func owner(maxSubscribers: Int) -> (Owner, ScriptedStore) {
        let store = ScriptedStore()
        let owner = Owner(store: store, initial: .initial, maxSubscribers: maxSubscribers)
        owner.start()
        return (owner, store)
    }

    /// An `EventSubscriber` of `owner` whose wakes are counted.
    static func subscribe(_ owner: Owner) throws -> Client {
        let wakes = Counter()
        let subscription = try owner.subscribe { id, first in
            EventSubscriber(id: id, first: first, wake: { wakes.increment() })
        }
        return Client(subscriber: subscription.subscriber, wakes: wakes)
    }

    /// A change made elsewhere reaches the owner through its store.
    static func publish(_ store: ScriptedStore, _ version: UInt64, _ token: String?) {
        store.report(.changed(TokenState(version: version, token: token)))
    }

    @Test("subscribe gives the current snapshot first")
    func currentFirst() throws {
        let (owner, _) = Self.owner(maxSubscribers: 4)
        let atStart = try Self.subscribe(owner)
        #expect(string(readOnce(atStart.subscriber).bytes) == expectedEvent(0, nil))
        owner.register(deviceToken: [0xfe, 0xed])  // the commit delivers it to atStart too
        let later = try Self.subscribe(owner)

        #expect(string(drain(atStart.subscriber).bytes) == expectedEvent(1, "feed"))
        #expect(string(drain(later.subscriber).bytes) == expectedEvent(1, "feed"))
        #expect(atStart.wakes.value == 0)
        #expect(later.wakes.value == 0)
        #expect(atStart.subscriber.id != later.subscriber.id)
        #expect(owner.subscriberCount == 2)
        #expect(owner.maxSubscribers == 4)
    }

    @Test("a change from elsewhere wakes only suspended subscribers, once; older and equal versions nothing")
    func publishWakesSuspendedOnly() throws {
        let (owner, store) = Self.owner(maxSubscribers: 8)
        let waiting = try Self.subscribe(owner)
        let busy = try Self.subscribe(owner)
        #expect(drain(waiting.subscriber).result == .suspended)

        Self.publish(store, 1, "01")
        #expect(owner.current.version == 1)
        #expect(waiting.wakes.value == 1)
        #expect(busy.wakes.value == 0, "never suspended: its reader is still going")

        Self.publish(store, 1, "ff")  // the same version again: not applied
        Self.publish(store, 0, nil)  // an older one: not applied
        #expect(owner.current == TokenSnapshot(version: 1, token: "01"))
        Self.publish(store, 2, "02")  // newer, but the waiting one was already resumed
        #expect(owner.current.version == 2)
        #expect(waiting.wakes.value == 1)
        #expect(busy.wakes.value == 0)

        let waitingOut = drain(waiting.subscriber)
        #expect(string(waitingOut.bytes) == expectedEvent(2, "02"))
        let busyOut = drain(busy.subscriber)
        #expect(string(busyOut.bytes) == expectedEvent(2, "02"), "skips to the newest, never older after newer")

        // Both are suspended now: the next change wakes each once, and a write wakes them alike.
        Self.publish(store, 3, "03")
        #expect(waiting.wakes.value == 2)
        #expect(busy.wakes.value == 1)
        _ = drain(waiting.subscriber)
        _ = drain(busy.subscriber)
        owner.register(deviceToken: [4])
        #expect(waiting.wakes.value == 3)
        #expect(busy.wakes.value == 2)
        #expect(string(drain(busy.subscriber).bytes) == expectedEvent(4, "04"))
    }

    @Test("at maxSubscribers subscribe throws .full; remove frees a place")
    func limitAndRemove() throws {
        let (owner, store) = Self.owner(maxSubscribers: 2)
        let a = try Self.subscribe(owner)
        let b = try Self.subscribe(owner)
        #expect(owner.subscriberCount == 2)
        #expect(throws: Refusal.full) { _ = try Self.subscribe(owner) }
        #expect(owner.subscriberCount == 2)

        owner.unsubscribe(a.subscriber.id)
        #expect(owner.subscriberCount == 1)
        owner.unsubscribe(a.subscriber.id)  // twice: ignored
        owner.unsubscribe(123_456)  // unknown: ignored
        #expect(owner.subscriberCount == 1)

        let c = try Self.subscribe(owner)
        #expect(c.subscriber.id != a.subscriber.id, "ids are unique for the owner's lifetime")
        #expect(c.subscriber.id != b.subscriber.id)
        #expect(throws: Refusal.full) { _ = try Self.subscribe(owner) }

        // A removed subscriber is not offered anything any more.
        owner.unsubscribe(b.subscriber.id)
        _ = drain(b.subscriber)
        Self.publish(store, 1, "01")
        #expect(b.wakes.value == 0)
        #expect(owner.subscriberCount == 1)
    }

    @Test("stop(): new subscribers get .stopping, open streams finish; suspended ones are woken")
    func close() throws {
        let (owner, store) = Self.owner(maxSubscribers: 8)
        let suspended = try Self.subscribe(owner)
        let midEvent = try Self.subscribe(owner)
        #expect(drain(suspended.subscriber).result == .suspended)
        let head = readOnce(midEvent.subscriber, size: 5)
        #expect(head.result == .bytes(5))

        owner.stop()
        #expect(suspended.wakes.value == 1)
        #expect(midEvent.wakes.value == 0)
        #expect(throws: Refusal.stopping) { _ = try Self.subscribe(owner) }

        #expect(readOnce(suspended.subscriber).result == .endOfStream)
        let rest = drain(midEvent.subscriber)
        #expect(string(head.bytes + rest.bytes) == expectedEvent(0, nil), "the event being written completes")
        #expect(rest.result == .endOfStream)

        // Nothing is offered after the close: a write is refused, and a change from the store
        // reaches no ended stream.
        let refused = Locked<CommitOutcome?>(nil)
        owner.commit("07") { outcome in refused.withLock { $0 = outcome } }
        #expect(refused.withLock { $0 } == .stopping)
        Self.publish(store, 7, "07")
        owner.heartbeat()
        #expect(suspended.wakes.value == 1)
        #expect(readOnce(suspended.subscriber).result == .endOfStream)

        owner.stop()  // idempotent
        #expect(throws: Refusal.stopping) { _ = try Self.subscribe(owner) }
    }

    @Test("stop() at the limit still answers .stopping")
    func closingWinsOverFull() throws {
        let (owner, _) = Self.owner(maxSubscribers: 1)
        _ = try Self.subscribe(owner)
        owner.stop()
        #expect(throws: Refusal.stopping) { _ = try Self.subscribe(owner) }
    }

    @Test("abort(id) ends that stream at once and wakes it if suspended")
    func abortOne() throws {
        let (owner, _) = Self.owner(maxSubscribers: 8)
        let target = try Self.subscribe(owner)
        let other = try Self.subscribe(owner)
        #expect(drain(target.subscriber).result == .suspended)
        #expect(drain(other.subscriber).result == .suspended)

        owner.abort(target.subscriber.id)
        #expect(target.wakes.value == 1)
        #expect(other.wakes.value == 0)
        #expect(readOnce(target.subscriber).result == .abort)
        #expect(readOnce(other.subscriber).result == .suspended)

        owner.abort(target.subscriber.id)  // again: no second wake
        owner.abort(999)  // unknown: ignored
        #expect(target.wakes.value == 1)
        #expect(owner.subscriberCount == 2, "abort does not remove; the engine removes when the connection is gone")
    }

    @Test("a subscription ends its own subscriber alone: abort() ends its stream, cancel() removes it, each idempotent")
    func subscriptionHandle() throws {
        let (owner, _) = Self.owner(maxSubscribers: 8)
        let wakes = Counter()
        let subscription = try owner.subscribe { id, first in
            EventSubscriber(id: id, first: first, wake: { wakes.increment() })
        }
        let other = try Self.subscribe(owner)
        #expect(subscription.id == subscription.subscriber.id && subscription.id != other.subscriber.id)
        #expect(drain(subscription.subscriber).result == .suspended)
        #expect(drain(other.subscriber).result == .suspended)

        subscription.abort()
        subscription.abort()  // again: no second wake
        #expect(wakes.value == 1 && other.wakes.value == 0)
        #expect(readOnce(subscription.subscriber).result == .abort)
        #expect(readOnce(other.subscriber).result == .suspended)
        #expect(owner.subscriberCount == 2)

        subscription.cancel()
        subscription.cancel()  // again: ignored
        #expect(owner.subscriberCount == 1)
        owner.commit("ab") { _ in }
        #expect(other.wakes.value == 1, "the other subscriber still gets changes")
        #expect(wakes.value == 1, "the cancelled one does not")
    }

    @Test("abortAll() ends every stream at once")
    func abortAll() throws {
        let (owner, _) = Self.owner(maxSubscribers: 8)
        let suspended = try Self.subscribe(owner)
        let busy = try Self.subscribe(owner)
        _ = drain(suspended.subscriber)
        owner.abortAll()
        #expect(suspended.wakes.value == 1)
        #expect(busy.wakes.value == 0)
        #expect(readOnce(suspended.subscriber).result == .abort)
        #expect(readOnce(busy.subscriber).result == .abort)
    }

    @Test("heartbeatTick() wakes idle subscribers, who then write ': keep-alive'")
    func heartbeat() throws {
        let (owner, _) = Self.owner(maxSubscribers: 8)
        let idle = try Self.subscribe(owner)
        let fresh = try Self.subscribe(owner)
        _ = drain(idle.subscriber)

        owner.heartbeat()
        #expect(idle.wakes.value == 1)
        #expect(fresh.wakes.value == 0)
        #expect(drain(idle.subscriber).bytes == ServerSentEvents.heartbeat)
        #expect(string(drain(fresh.subscriber).bytes) == expectedEvent(0, nil), "its first event, no heartbeat")
    }

    @Test("concurrency: publishers and subscribers on many threads; ids never decrease")
    func concurrentPublishAndSubscribe() async throws {
        let (owner, store) = Self.owner(maxSubscribers: 1000)
        let problems = Locked<[String]>([])
        let publishersDone = Locked(0)
        let publishers = 4
        let perPublisher = 300

        // One long-lived subscriber, read by its own thread throughout.
        let watcher = try Self.subscribe(owner)
        let watched = Locked<[UInt8]>(drain(watcher.subscriber).bytes)

        await runOnThreads(publishers + 4 + 1) { thread in
            switch thread {
            case ..<publishers:
                for i in 0..<perPublisher {
                    let change = owner.register(deviceToken: [UInt8(thread), UInt8(i >> 8), UInt8(i & 0xff)])
                    Self.publish(store, change.version, change.token)  // the echo of its own write
                    if i % 10 == 0 { Self.publish(store, owner.current.version, owner.current.token) }
                    if i % 25 == 0 { owner.heartbeat() }
                }
                publishersDone.withLock { $0 += 1 }
            case publishers..<(publishers + 4):
                for round in 0..<60 {
                    let wakes = Counter()
                    let subscriber: EventSubscriber
                    do {
                        subscriber =
                            try owner.subscribe { id, first in
                                EventSubscriber(id: id, first: first, wake: { wakes.increment() })
                            }.subscriber
                    } catch {
                        problems.withLock { $0.append("subscribe refused: \(error)") }
                        continue
                    }
                    var bytes: [UInt8] = []
                    for _ in 0..<(round % 7 + 1) {
                        bytes += drain(subscriber, size: 17).bytes
                    }
                    let ids = eventIDs(bytes)
                    if !zip(ids, ids.dropFirst()).allSatisfy({ $0 < $1 }) {
                        problems.withLock { $0.append("subscriber \(subscriber.id) saw ids \(ids)") }
                    }
                    if round % 3 == 0 { owner.abort(subscriber.id) }
                    owner.unsubscribe(subscriber.id)
                }
            default:
                while publishersDone.withLock({ $0 }) < publishers {
                    let bytes = drain(watcher.subscriber, size: 23).bytes
                    watched.withLock { $0 += bytes }
                }
            }
        }

        #expect(problems.withLock { $0 }.isEmpty, "\(problems.withLock { $0 })")
        #expect(owner.subscriberCount == 1, "only the watcher is left")
        #expect(owner.current.version == UInt64(publishers * perPublisher))

        // The watcher ends on the final version, with strictly increasing ids throughout.
        Self.publish(store, owner.current.version, owner.current.token)
        let all = watched.withLock { $0 } + drain(watcher.subscriber).bytes
        let ids = eventIDs(all)
        #expect(ids.first == 0)
        #expect(ids.last == owner.current.version)
        #expect(zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 })
        // Apart from events and heartbeats, nothing else is in the stream.
        let blocks = string(all).components(separatedBy: "\n\n").dropLast()
        #expect(blocks.allSatisfy { $0 == ": keep-alive" || $0.hasPrefix("id: ") }, "unexpected block in the stream")
    }
}
