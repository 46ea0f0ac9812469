import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushTokenHTTP

/// The subscribers of `GET /token/stream` and the owner's fan-out to them.
@Suite("TokenOwner fan-out to EventSubscribers")
struct FanOutTests {
    /// A subscriber with its wake counter.
    struct Client {
        let subscriber: EventSubscriber
        let wakes: Counter
    }

    static func subscribe(_ hub: Hub) throws -> Client {
        let wakes = Counter()
        let subscriber = try hub.subscribe { wakes.increment() }
        return Client(subscriber: subscriber, wakes: wakes)
    }

    @Test("subscribe gives the current snapshot first")
    func currentFirst() throws {
        let hub = Hub(maxSubscribers: 4)
        let atStart = try Self.subscribe(hub)
        #expect(string(readOnce(atStart.subscriber).bytes) == expectedEvent(0, nil))
        hub.register([0xfe, 0xed])  // the commit delivers it to atStart too
        let later = try Self.subscribe(hub)

        #expect(string(drain(atStart.subscriber).bytes) == expectedEvent(1, "feed"))
        #expect(string(drain(later.subscriber).bytes) == expectedEvent(1, "feed"))
        #expect(atStart.wakes.value == 0)
        #expect(later.wakes.value == 0)
        #expect(atStart.subscriber.id != later.subscriber.id)
        #expect(hub.count == 2)
        #expect(hub.maxSubscribers == 4)
    }

    @Test("publish wakes only suspended subscribers, once")
    func publishWakesSuspendedOnly() throws {
        let hub = Hub(maxSubscribers: 8)
        let waiting = try Self.subscribe(hub)
        let busy = try Self.subscribe(hub)
        #expect(drain(waiting.subscriber).result == .suspended)

        let v1 = hub.register([1])
        hub.publish(v1)
        #expect(waiting.wakes.value == 1)
        #expect(busy.wakes.value == 0, "never suspended: its reader is still going")

        hub.publish(v1)  // the same version again
        hub.publish(TokenSnapshot(version: 0, token: nil))  // an older one
        let v2 = hub.register([2])
        hub.publish(v2)  // newer, but already resumed
        #expect(waiting.wakes.value == 1)
        #expect(busy.wakes.value == 0)

        let waitingOut = drain(waiting.subscriber)
        #expect(string(waitingOut.bytes) == expectedEvent(2, "02"))
        let busyOut = drain(busy.subscriber)
        #expect(string(busyOut.bytes) == expectedEvent(2, "02"), "skips to the newest, never older after newer")

        hub.publish(hub.register([3]))
        #expect(waiting.wakes.value == 2)
        #expect(busy.wakes.value == 1)
    }

    @Test("at maxSubscribers subscribe throws .full; remove frees a place")
    func limitAndRemove() throws {
        let hub = Hub(maxSubscribers: 2)
        let a = try Self.subscribe(hub)
        let b = try Self.subscribe(hub)
        #expect(hub.count == 2)
        #expect(throws: Hub.Refusal.full) { _ = try hub.subscribe() }
        #expect(hub.count == 2)

        hub.remove(a.subscriber.id)
        #expect(hub.count == 1)
        hub.remove(a.subscriber.id)  // twice: ignored
        hub.remove(123_456)  // unknown: ignored
        #expect(hub.count == 1)

        let c = try Self.subscribe(hub)
        #expect(c.subscriber.id != a.subscriber.id, "ids are unique for the hub's lifetime")
        #expect(c.subscriber.id != b.subscriber.id)
        #expect(throws: Hub.Refusal.full) { _ = try hub.subscribe() }

        // A removed subscriber is not offered anything any more.
        hub.remove(b.subscriber.id)
        _ = drain(b.subscriber)
        hub.publish(TokenSnapshot(version: 1, token: "01"))
        #expect(b.wakes.value == 0)
        #expect(hub.count == 1)
    }

    @Test("stop(): new subscribers get .stopping, open streams finish; suspended ones are woken")
    func close() throws {
        let hub = Hub(maxSubscribers: 8)
        let suspended = try Self.subscribe(hub)
        let midEvent = try Self.subscribe(hub)
        #expect(drain(suspended.subscriber).result == .suspended)
        let head = readOnce(midEvent.subscriber, size: 5)
        #expect(head.result == .bytes(5))

        hub.close()
        #expect(suspended.wakes.value == 1)
        #expect(midEvent.wakes.value == 0)
        #expect(throws: Hub.Refusal.stopping) { _ = try hub.subscribe() }

        #expect(readOnce(suspended.subscriber).result == .endOfStream)
        let rest = drain(midEvent.subscriber)
        #expect(string(head.bytes + rest.bytes) == expectedEvent(0, nil), "the event being written completes")
        #expect(rest.result == .endOfStream)

        // Nothing is offered after the close: a write is refused, and a change from the store
        // reaches no ended stream.
        let refused = Locked<CommitOutcome?>(nil)
        hub.owner.commit("07") { outcome in refused.withLock { $0 = outcome } }
        #expect(refused.withLock { $0 } == .stopping)
        hub.publish(TokenSnapshot(version: 7, token: "07"))
        hub.heartbeatTick()
        #expect(suspended.wakes.value == 1)
        #expect(readOnce(suspended.subscriber).result == .endOfStream)

        hub.close()  // idempotent
        #expect(throws: Hub.Refusal.stopping) { _ = try hub.subscribe() }
    }

    @Test("stop() at the limit still answers .stopping")
    func closingWinsOverFull() throws {
        let hub = Hub(maxSubscribers: 1)
        _ = try Self.subscribe(hub)
        hub.close()
        #expect(throws: Hub.Refusal.stopping) { _ = try hub.subscribe() }
    }

    @Test("abort(id) ends that stream at once and wakes it if suspended")
    func abortOne() throws {
        let hub = Hub(maxSubscribers: 8)
        let target = try Self.subscribe(hub)
        let other = try Self.subscribe(hub)
        #expect(drain(target.subscriber).result == .suspended)
        #expect(drain(other.subscriber).result == .suspended)

        hub.abort(target.subscriber.id)
        #expect(target.wakes.value == 1)
        #expect(other.wakes.value == 0)
        #expect(readOnce(target.subscriber).result == .abort)
        #expect(readOnce(other.subscriber).result == .suspended)

        hub.abort(target.subscriber.id)  // again: no second wake
        hub.abort(999)  // unknown: ignored
        #expect(target.wakes.value == 1)
        #expect(hub.count == 2, "abort does not remove; the engine removes when the connection is gone")
    }

    @Test("abortAll() ends every stream at once")
    func abortAll() throws {
        let hub = Hub(maxSubscribers: 8)
        let suspended = try Self.subscribe(hub)
        let busy = try Self.subscribe(hub)
        _ = drain(suspended.subscriber)
        hub.abortAll()
        #expect(suspended.wakes.value == 1)
        #expect(busy.wakes.value == 0)
        #expect(readOnce(suspended.subscriber).result == .abort)
        #expect(readOnce(busy.subscriber).result == .abort)
    }

    @Test("heartbeatTick() wakes idle subscribers, who then write ': keep-alive'")
    func heartbeat() throws {
        let hub = Hub(maxSubscribers: 8)
        let idle = try Self.subscribe(hub)
        let fresh = try Self.subscribe(hub)
        _ = drain(idle.subscriber)

        hub.heartbeatTick()
        #expect(idle.wakes.value == 1)
        #expect(fresh.wakes.value == 0)
        #expect(drain(idle.subscriber).bytes == ServerSentEvents.heartbeat)
        #expect(string(drain(fresh.subscriber).bytes) == expectedEvent(0, nil), "its first event, no heartbeat")
    }

    @Test("concurrency: publishers and subscribers on many threads; ids never decrease")
    func concurrentPublishAndSubscribe() async throws {
        let hub = Hub(maxSubscribers: 1000)
        let problems = Locked<[String]>([])
        let publishersDone = Locked(0)
        let publishers = 4
        let perPublisher = 300

        // One long-lived subscriber, read by its own thread throughout.
        let watcher = try Self.subscribe(hub)
        let watched = Locked<[UInt8]>(drain(watcher.subscriber).bytes)

        await runOnThreads(publishers + 4 + 1) { thread in
            switch thread {
            case ..<publishers:
                for i in 0..<perPublisher {
                    let change = hub.register([UInt8(thread), UInt8(i >> 8), UInt8(i & 0xff)])
                    hub.publish(change)
                    if i % 10 == 0 { hub.publish(hub.snapshot) }
                    if i % 25 == 0 { hub.heartbeatTick() }
                }
                publishersDone.withLock { $0 += 1 }
            case publishers..<(publishers + 4):
                for round in 0..<60 {
                    let wakes = Counter()
                    let subscriber: EventSubscriber
                    do {
                        subscriber = try hub.subscribe { wakes.increment() }
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
                    if round % 3 == 0 { hub.abort(subscriber.id) }
                    hub.remove(subscriber.id)
                }
            default:
                while publishersDone.withLock({ $0 }) < publishers {
                    let bytes = drain(watcher.subscriber, size: 23).bytes
                    watched.withLock { $0 += bytes }
                }
            }
        }

        #expect(problems.withLock { $0 }.isEmpty, "\(problems.withLock { $0 })")
        #expect(hub.count == 1, "only the watcher is left")
        #expect(hub.snapshot.version == UInt64(publishers * perPublisher))

        // The watcher ends on the final version, with strictly increasing ids throughout.
        hub.publish(hub.snapshot)
        let all = watched.withLock { $0 } + drain(watcher.subscriber).bytes
        let ids = eventIDs(all)
        #expect(ids.first == 0)
        #expect(ids.last == hub.snapshot.version)
        #expect(zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 })
        // Apart from events and heartbeats, nothing else is in the stream.
        let blocks = string(all).components(separatedBy: "\n\n").dropLast()
        #expect(blocks.allSatisfy { $0 == ": keep-alive" || $0.hasPrefix("id: ") }, "unexpected block in the stream")
    }
}
