import ForgePushTokenOwner
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// The conflating state machine of one `GET /token/stream` connection, driven through
/// `read(into:suspend:)` with real buffers.
@Suite("EventSubscriber")
struct EventSubscriberTests {
    static func snapshot(_ version: UInt64) -> TokenSnapshot {
        TokenSnapshot(
            version: version, token: version == 0 ? nil : lowerHex([UInt8(truncatingIfNeeded: version), 0xee]))
    }

    /// A subscriber whose first snapshot (version 1) is already written and that is suspended.
    static func idle(sourceLocation: SourceLocation = #_sourceLocation) -> EventSubscriber {
        let subscriber = EventSubscriber(id: 4, first: snapshot(1), wake: {})
        let first = drain(subscriber, sourceLocation: sourceLocation)
        #expect(first.bytes == snapshot(1).event, sourceLocation: sourceLocation)
        #expect(first.result == .suspended, sourceLocation: sourceLocation)
        #expect(first.suspends == 1, sourceLocation: sourceLocation)
        return subscriber
    }

    @Test("the first read gives the first snapshot's event")
    func firstRead() {
        for first in [Self.snapshot(0), Self.snapshot(1), TokenSnapshot(version: 41, token: lowerHex(tokenBytes(256)))]
        {
            let subscriber = EventSubscriber(id: 9, first: first, wake: {})
            #expect(subscriber.id == 9)
            let read = readOnce(subscriber)
            #expect(read.result == .bytes(first.event.count))
            #expect(read.bytes == first.event)
            #expect(read.suspends == 0)
        }
    }

    @Test("with nothing to write: suspend is called exactly once and the result is .suspended")
    func suspendsOnce() {
        let subscriber = EventSubscriber(id: 0, first: Self.snapshot(0), wake: {})
        _ = readOnce(subscriber)
        let idle = readOnce(subscriber)
        #expect(idle.result == .suspended)
        #expect(idle.suspends == 1)
        #expect(idle.bytes.isEmpty)
    }

    @Test("offer(newer) asks for a resume exactly once per suspension")
    func offerResumesOnce() {
        let subscriber = Self.idle()
        #expect(subscriber.offer(Self.snapshot(2)) == true)
        #expect(subscriber.offer(Self.snapshot(3)) == false, "not suspended any more")
        #expect(subscriber.heartbeatTick() == false)
        #expect(subscriber.end(.finish, reason: .shutdown) == false)
    }

    @Test("offer while not suspended returns false and the event is still written")
    func offerWhileBusy() {
        let subscriber = EventSubscriber(id: 0, first: Self.snapshot(1), wake: {})
        #expect(subscriber.offer(Self.snapshot(2)) == false, "never suspended yet")
        let out = drain(subscriber)
        // The first event was not started when v2 arrived: the subscriber skips to the newest.
        #expect(out.bytes == Self.snapshot(2).event)
        #expect(out.result == .suspended)
    }

    @Test("older and equal versions are ignored")
    func olderIgnored() {
        let subscriber = Self.idle()
        #expect(subscriber.offer(Self.snapshot(1)) == false, "equal to the first")
        #expect(subscriber.offer(Self.snapshot(0)) == false, "older")
        let stillIdle = readOnce(subscriber)
        #expect(stillIdle.result == .suspended, "an ignored offer leaves nothing to write")
        #expect(stillIdle.suspends == 1)

        #expect(subscriber.offer(Self.snapshot(5)) == true)
        #expect(subscriber.offer(Self.snapshot(4)) == false)
        #expect(subscriber.offer(Self.snapshot(5)) == false)
        let out = drain(subscriber)
        #expect(out.bytes == Self.snapshot(5).event)
        #expect(out.result == .suspended)

        #expect(subscriber.offer(Self.snapshot(3)) == false, "older than one already written")
        #expect(readOnce(subscriber).result == .suspended)
    }

    @Test("conflation: v2, v3, v4 while suspended → only v4 is written")
    func conflation() {
        let subscriber = Self.idle()
        #expect(subscriber.offer(Self.snapshot(2)) == true)
        #expect(subscriber.offer(Self.snapshot(3)) == false)
        #expect(subscriber.offer(Self.snapshot(4)) == false)
        let out = drain(subscriber)
        #expect(string(out.bytes) == string(Self.snapshot(4).event))
        #expect(out.byteReads == 1)
        #expect(out.result == .suspended)
        #expect(out.suspends == 1)
    }

    @Test("a small buffer writes an event across several reads, exactly", arguments: [1, 2, 7, 13, 50])
    func smallBuffer(size: Int) {
        let first = TokenSnapshot(version: 12, token: lowerHex(tokenBytes(32)))
        let subscriber = EventSubscriber(id: 0, first: first, wake: {})
        var collected: [UInt8] = []
        var reads = 0
        while collected.count < first.event.count {
            let step = readOnce(subscriber, size: size)
            guard case .bytes(let count) = step.result else {
                Issue.record("stopped after \(collected.count) of \(first.event.count) bytes: \(step.result)")
                return
            }
            #expect(count == min(size, first.event.count - collected.count))
            collected += step.bytes
            reads += 1
        }
        #expect(collected == first.event)
        #expect(reads == (first.event.count + size - 1) / size)
        #expect(readOnce(subscriber, size: size).result == .suspended)

        // An offer in the middle of an event does not cut it: the event completes, then the newer one.
        #expect(subscriber.offer(TokenSnapshot(version: 13, token: "01")) == true)
        let part = readOnce(subscriber, size: size)
        #expect(subscriber.offer(TokenSnapshot(version: 14, token: "02")) == false)
        let rest = drain(subscriber, size: size)
        #expect(string(part.bytes + rest.bytes) == expectedEvent(13, "01") + expectedEvent(14, "02"))
        #expect(rest.result == .suspended)
    }

    @Test("heartbeat while idle: resume, then ': keep-alive' LF LF, then idle again")
    func heartbeatIdle() {
        let subscriber = Self.idle()
        #expect(subscriber.heartbeatTick() == true)
        #expect(subscriber.heartbeatTick() == false, "already resumed")
        let out = drain(subscriber)
        #expect(out.bytes == utf8(": keep-alive\n\n"))
        #expect(out.result == .suspended)
        #expect(out.suspends == 1)
    }

    @Test("heartbeat while idle but not yet suspended: no resume, the next read gives it")
    func heartbeatBeforeSuspend() {
        let subscriber = EventSubscriber(id: 0, first: Self.snapshot(1), wake: {})
        _ = readOnce(subscriber)  // the whole first event
        #expect(subscriber.heartbeatTick() == false)
        let out = drain(subscriber)
        #expect(out.bytes == ServerSentEvents.heartbeat)
        #expect(out.result == .suspended)
    }

    @Test("heartbeat with an event pending: false, and the event is written instead")
    func heartbeatWithPendingEvent() {
        let fresh = EventSubscriber(id: 0, first: Self.snapshot(1), wake: {})
        #expect(fresh.heartbeatTick() == false)
        let first = drain(fresh)
        #expect(first.bytes == Self.snapshot(1).event, "no heartbeat before or after the first event")

        let subscriber = Self.idle()
        #expect(subscriber.offer(Self.snapshot(2)) == true)
        #expect(subscriber.heartbeatTick() == false)
        let out = drain(subscriber)
        #expect(out.bytes == Self.snapshot(2).event)
        #expect(out.result == .suspended)
    }

    @Test("an event offered after a heartbeat was asked for replaces it")
    func eventSupersedesHeartbeat() {
        let subscriber = Self.idle()
        #expect(subscriber.heartbeatTick() == true)
        #expect(subscriber.offer(Self.snapshot(2)) == false, "already resumed by the heartbeat")
        let out = drain(subscriber)
        #expect(out.bytes == Self.snapshot(2).event)
        #expect(out.result == .suspended)
    }

    @Test("end(.finish): the partial event completes, then .endOfStream, never suspending again")
    func finishCompletesEvent() {
        let first = TokenSnapshot(version: 3, token: lowerHex(tokenBytes(8)))
        let subscriber = EventSubscriber(id: 0, first: first, wake: {})
        let head = readOnce(subscriber, size: 7)
        #expect(head.result == .bytes(7))
        #expect(subscriber.end(.finish, reason: .shutdown) == false, "not suspended")
        #expect(subscriber.offer(TokenSnapshot(version: 4, token: "ff")) == false)
        #expect(subscriber.heartbeatTick() == false)

        let rest = drain(subscriber, size: 7)
        #expect(head.bytes + rest.bytes == first.event)
        #expect(rest.result == .endOfStream)
        #expect(rest.suspends == 0)
        for _ in 0..<3 {
            let again = readOnce(subscriber)
            #expect(again.result == .endOfStream)
            #expect(again.suspends == 0)
        }
    }

    @Test("end(.finish) still delivers an event offered before it: nothing is lost at shutdown")
    func finishDeliversPendingEvent() {
        let first = TokenSnapshot(version: 0, token: nil)
        let subscriber = EventSubscriber(id: 0, first: first, wake: {})
        #expect(subscriber.end(.finish, reason: .shutdown) == false)
        let out = drain(subscriber)
        #expect(out.bytes == first.event)
        #expect(out.result == .endOfStream)
        #expect(out.suspends == 0)
    }

    @Test("a zero-byte buffer writes nothing and changes nothing")
    func zeroByteBuffer() {
        let first = TokenSnapshot(version: 0, token: nil)
        let subscriber = EventSubscriber(id: 0, first: first, wake: {})
        var suspended = false
        let empty = UnsafeMutableRawBufferPointer(start: nil, count: 0)
        #expect(subscriber.read(into: empty) { suspended = true } == .bytes(0))
        #expect(!suspended)
        #expect(drain(subscriber).bytes == first.event)
    }

    @Test("end(.finish) while suspended resumes once, then .endOfStream")
    func finishWhileSuspended() {
        let subscriber = Self.idle()
        #expect(subscriber.end(.finish, reason: .shutdown) == true)
        #expect(subscriber.end(.finish, reason: .shutdown) == false)
        let out = readOnce(subscriber)
        #expect(out.result == .endOfStream)
        #expect(out.suspends == 0)
    }

    @Test("end(.abort): .abort at once, even mid-event")
    func abortAtOnce() {
        let subscriber = EventSubscriber(id: 0, first: Self.snapshot(1), wake: {})
        _ = readOnce(subscriber, size: 5)
        #expect(subscriber.end(.abort, reason: .client) == false)
        let out = readOnce(subscriber)
        #expect(out.result == .abort)
        #expect(out.bytes.isEmpty)
        #expect(out.suspends == 0)
        #expect(readOnce(subscriber).result == .abort)

        let suspended = Self.idle()
        #expect(suspended.end(.abort, reason: .client) == true)
        #expect(suspended.end(.abort, reason: .client) == false)
        #expect(readOnce(suspended).result == .abort)
    }

    @Test(".abort wins over .finish, in either order")
    func abortWins() {
        let finishThenAbort = Self.idle()
        #expect(finishThenAbort.end(.finish, reason: .shutdown) == true)
        #expect(finishThenAbort.end(.abort, reason: .client) == false)
        #expect(readOnce(finishThenAbort).result == .abort)

        let abortThenFinish = Self.idle()
        #expect(abortThenFinish.end(.abort, reason: .client) == true)
        #expect(abortThenFinish.end(.finish, reason: .shutdown) == false)
        #expect(readOnce(abortThenFinish).result == .abort)

        let midEvent = EventSubscriber(id: 0, first: Self.snapshot(1), wake: {})
        _ = readOnce(midEvent, size: 3)
        _ = midEvent.end(.finish, reason: .shutdown)
        _ = midEvent.end(.abort, reason: .client)
        #expect(readOnce(midEvent).result == .abort)
    }

    @Test("after an end, offers and heartbeats are ignored")
    func nothingAfterEnd() {
        let subscriber = Self.idle()
        #expect(subscriber.end(.finish, reason: .shutdown) == true)
        #expect(subscriber.offer(Self.snapshot(2)) == false)
        #expect(subscriber.heartbeatTick() == false)
        let out = drain(subscriber)
        #expect(out.bytes.isEmpty)
        #expect(out.result == .endOfStream)
    }

    @Test("a long run of offers and reads: ids strictly increase, memory stays one event")
    func longRun() {
        let subscriber = EventSubscriber(id: 0, first: Self.snapshot(0), wake: {})
        var bytes = drain(subscriber, size: 9).bytes
        var resumes = 0
        for version in UInt64(1)...500 {
            if subscriber.offer(Self.snapshot(version)) { resumes += 1 }
            if version % 3 == 0 {
                let out = drain(subscriber, size: 9)
                bytes += out.bytes
                #expect(out.result == .suspended)
            }
        }
        bytes += drain(subscriber, size: 9).bytes
        let ids = eventIDs(bytes)
        #expect(ids.first == 0)
        #expect(ids.last == 500)
        #expect(zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 })
        #expect(ids.count == 1 + 500 / 3 + 1)
        #expect(resumes == 500 / 3 + 1, "one resume per suspension")
    }
}
