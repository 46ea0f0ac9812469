import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// `EventSubscriber` against a reference: the subscriber as it was before it kept an offered event
/// as bytes and its first event apart (one `pending: TokenSnapshot?`), driven through the same
/// random interleavings of offers, heartbeats, ends and reads of every buffer size; plus the
/// semantics spelled out one by one (floors, skipped counts, the first event) and a threaded run.
@Suite("EventSubscriber against the one-snapshot reference")
struct EventSubscriberReferenceTests {
    /// The subscriber's semantics as the one-snapshot implementation had them (0aaf746^), with
    /// its tally.
    struct Reference {
        var pending: TokenSnapshot?
        var lastOffered: UInt64?
        var output: [UInt8]
        var offset = 0
        var heartbeatDue = false
        var ending: SubscriberEnding?
        var suspended = false
        var sent: UInt64 = 0
        var skipped: UInt64 = 0

        init(first: TokenSnapshot, preamble: [UInt8], floor: UInt64?) {
            pending = first
            lastOffered = first.version
            output = preamble
            if let floor, floor > first.version {
                pending = nil
                lastOffered = floor - 1
            }
        }

        mutating func takeResume() -> Bool {
            guard suspended else { return false }
            suspended = false
            return true
        }

        mutating func offer(_ snapshot: TokenSnapshot) -> Bool {
            if let last = lastOffered, snapshot.version <= last { return false }
            guard ending == nil else { return false }
            if pending != nil { skipped += 1 }
            pending = snapshot
            lastOffered = snapshot.version
            return takeResume()
        }

        mutating func heartbeatTick() -> Bool {
            guard ending == nil, pending == nil else { return false }
            heartbeatDue = true
            return takeResume()
        }

        mutating func end(_ newEnding: SubscriberEnding) -> Bool {
            if ending != .abort { ending = newEnding }
            return takeResume()
        }

        mutating func read(size: Int) -> (EventStreamRead, [UInt8], Int) {
            if ending == .abort { return (.abort, [], 0) }
            guard size > 0 else { return (.bytes(0), [], 0) }
            if offset == output.count {
                if let next = pending {
                    output = next.event
                    pending = nil
                    sent += 1
                    heartbeatDue = false
                } else if heartbeatDue, ending == nil {
                    output = ServerSentEvents.heartbeat
                    heartbeatDue = false
                } else if ending == .finish {
                    return (.endOfStream, [], 0)
                } else {
                    suspended = true
                    return (.suspended, [], 1)
                }
                offset = 0
            }
            let count = min(size, output.count - offset)
            let bytes = Array(output[offset..<(offset + count)])
            offset += count
            return (.bytes(count), bytes, 0)
        }
    }

    static func snapshot(_ version: UInt64, prepared: Bool) -> TokenSnapshot {
        let token: String? =
            version % 5 == 0
            ? nil : lowerHex(tokenBytes(Int(version % 7) + 1, seed: UInt8(truncatingIfNeeded: version)))
        let snapshot = TokenSnapshot(version: version, token: token)
        return prepared ? snapshot.prepared() : snapshot
    }

    /// Replays one random sequence on both; records an issue at the first difference.
    /// - Returns: whether they agreed throughout.
    @discardableResult
    static func replay(seed: UInt64, steps: Int, sourceLocation: SourceLocation = #_sourceLocation) -> Bool {
        var random = SeededGenerator(state: seed)
        let firstVersion = UInt64.random(in: 0...6, using: &random)
        let first = snapshot(firstVersion, prepared: Bool.random(using: &random))
        let floor: UInt64? =
            switch Int.random(in: 0..<4, using: &random) {
            case 0: nil
            case 1: firstVersion  // equal: the first event is sent
            case 2: firstVersion &+ UInt64.random(in: 1...4, using: &random)  // above: it is not
            default: firstVersion == 0 ? nil : firstVersion - 1  // below: it is
            }
        let preamble: [UInt8] = Bool.random(using: &random) ? utf8("retry: 1500\n\n") : []
        let tally = DeliveryTally()
        let subject = EventSubscriber(id: 1, first: first, tally: tally, preamble: preamble, floor: floor, wake: {})
        var reference = Reference(first: first, preamble: preamble, floor: floor)
        var top = firstVersion
        var log: [String] = ["first \(firstVersion) floor \(String(describing: floor)) preamble \(!preamble.isEmpty)"]
        func fail(_ what: String) -> Bool {
            Issue.record(
                "seed \(seed): \(what)\nsteps:\n\(log.suffix(25).joined(separator: "\n"))",
                sourceLocation: sourceLocation)
            return false
        }
        for _ in 0..<steps {
            switch Int.random(in: 0..<100, using: &random) {
            case 0..<35:
                // Mostly newer, sometimes equal or older, now and then a jump.
                let version: UInt64
                switch Int.random(in: 0..<10, using: &random) {
                case 0: version = top == 0 ? 0 : top - UInt64.random(in: 0...min(top, 3), using: &random)
                case 1: version = top &+ UInt64.random(in: 2...5, using: &random)
                default: version = top &+ 1
                }
                top = max(top, version)
                let offered = snapshot(version, prepared: Bool.random(using: &random))
                log.append("offer \(version)")
                let got = subject.offer(offered)
                let want = reference.offer(offered)
                if got != want { return fail("offer(\(version)) returned \(got), reference \(want)") }
            case 35..<45:
                log.append("heartbeat")
                let got = subject.heartbeatTick()
                let want = reference.heartbeatTick()
                if got != want { return fail("heartbeatTick() returned \(got), reference \(want)") }
            case 45..<48:
                let ending: SubscriberEnding = Int.random(in: 0..<3, using: &random) == 0 ? .abort : .finish
                log.append("end \(ending)")
                let got = subject.end(ending, reason: .shutdown)
                let want = reference.end(ending)
                if got != want { return fail("end(\(ending)) returned \(got), reference \(want)") }
            default:
                let size = [1, 2, 3, 5, 8, 13, 21, 40, 64, 4096][Int.random(in: 0..<10, using: &random)]
                log.append("read \(size)")
                let got = readOnce(subject, size: size)
                let want = reference.read(size: size)
                if got.result != want.0 || got.bytes != want.1 || got.suspends != want.2 {
                    return fail(
                        "read(\(size)) gave \(got.result) \(string(got.bytes).debugDescription) suspends \(got.suspends); "
                            + "reference \(want.0) \(string(want.1).debugDescription) suspends \(want.2)")
                }
            }
            let counts = tally.counts
            if counts.sent != reference.sent || counts.skipped != reference.skipped {
                return fail(
                    "tally sent \(counts.sent) skipped \(counts.skipped); reference sent \(reference.sent) skipped \(reference.skipped)"
                )
            }
        }
        return true
    }

    @Test(
        "random interleavings of offers, heartbeats, ends and reads of small buffers: the same bytes, results, resumes and tally as the one-snapshot subscriber"
    )
    func matchesTheReference() {
        for seed in UInt64(1)...200 {
            if !Self.replay(seed: seed, steps: 80) { return }
        }
    }

    @Test(
        "a floor above the first event: no first event, no skip counted for the first offer at the floor, a heartbeat is allowed at once"
    )
    func floorAboveTheFirst() {
        let tally = DeliveryTally()
        let subscriber = EventSubscriber(
            id: 0, first: TokenSnapshot(version: 3, token: "aa"), tally: tally, floor: 6, wake: {})
        let idle = drain(subscriber)
        #expect(idle.bytes.isEmpty && idle.result == .suspended)
        #expect(subscriber.offer(TokenSnapshot(version: 4, token: "bb")) == false, "below the floor")
        #expect(subscriber.offer(TokenSnapshot(version: 5, token: "bb")) == false, "below the floor")
        #expect(subscriber.heartbeatTick() == true, "nothing pending: the heartbeat resumes")
        #expect(drain(subscriber).bytes == ServerSentEvents.heartbeat)
        #expect(subscriber.offer(TokenSnapshot(version: 6, token: "cc").prepared()) == true)
        let out = drain(subscriber, size: 3)
        #expect(string(out.bytes) == expectedEvent(6, "cc"))
        #expect(tally.counts == DeliveryCounts(sent: 1, skipped: 0))
    }

    @Test("a floor at or below the first event: the first event is sent", arguments: [UInt64(0), 2, 3])
    func floorAtOrBelowTheFirst(floor: UInt64) {
        let tally = DeliveryTally()
        let subscriber = EventSubscriber(
            id: 0, first: TokenSnapshot(version: 3, token: "aa"), tally: tally, preamble: utf8("retry: 5\n\n"),
            floor: floor, wake: {})
        #expect(subscriber.heartbeatTick() == false, "the first event is pending")
        let out = drain(subscriber, size: 4)
        #expect(string(out.bytes) == "retry: 5\n\n" + expectedEvent(3, "aa"))
        #expect(tally.counts == DeliveryCounts(sent: 1, skipped: 0))
        #expect(subscriber.offer(TokenSnapshot(version: 3, token: "zz")) == false, "the first event's id again")
    }

    @Test(
        "the unwritten first event replaced by an offer counts one skip; a replaced offer counts one; the event being written counts none"
    )
    func skippedCounts() {
        let tally = DeliveryTally()
        let subscriber = EventSubscriber(id: 0, first: TokenSnapshot(version: 1, token: "01"), tally: tally, wake: {})
        #expect(subscriber.offer(TokenSnapshot(version: 2, token: "02")) == false)  // replaces the first
        #expect(tally.counts == DeliveryCounts(sent: 0, skipped: 1))
        #expect(subscriber.offer(TokenSnapshot(version: 3, token: "03").prepared()) == false)  // replaces v2
        #expect(tally.counts == DeliveryCounts(sent: 0, skipped: 2))
        let head = readOnce(subscriber, size: 5)  // v3 begun
        #expect(tally.counts == DeliveryCounts(sent: 1, skipped: 2))
        #expect(subscriber.offer(TokenSnapshot(version: 4, token: "04")) == false)  // pending behind v3
        #expect(tally.counts == DeliveryCounts(sent: 1, skipped: 2), "v3 is being written, not skipped")
        #expect(subscriber.offer(TokenSnapshot(version: 4, token: "44")) == false, "same id again")
        #expect(subscriber.offer(TokenSnapshot(version: 2, token: "22")) == false, "older")
        #expect(tally.counts == DeliveryCounts(sent: 1, skipped: 2), "ignored offers count nothing")
        let rest = drain(subscriber, size: 5)
        #expect(string(head.bytes + rest.bytes) == expectedEvent(3, "03") + expectedEvent(4, "04"))
        #expect(tally.counts == DeliveryCounts(sent: 2, skipped: 2))
    }

    @Test(
        "end(.finish) before the first read: the first event, whole over a small buffer, then the end; an offer before the end replaces it"
    )
    func finishWithTheFirstUnwritten() {
        let first = TokenSnapshot(version: 7, token: lowerHex(tokenBytes(40)))
        let plain = EventSubscriber(id: 0, first: first, wake: {})
        #expect(plain.end(.finish, reason: .shutdown) == false)
        let out = drain(plain, size: 3)
        #expect(out.bytes == first.event && out.result == .endOfStream && out.suspends == 0)

        let tally = DeliveryTally()
        let replaced = EventSubscriber(id: 0, first: first, tally: tally, wake: {})
        #expect(replaced.offer(TokenSnapshot(version: 8, token: "08")) == false)
        #expect(replaced.end(.finish, reason: .shutdown) == false)
        #expect(replaced.offer(TokenSnapshot(version: 9, token: "09")) == false, "after the end")
        let after = drain(replaced, size: 2)
        #expect(string(after.bytes) == expectedEvent(8, "08") && after.result == .endOfStream)
        #expect(tally.counts == DeliveryCounts(sent: 1, skipped: 1))
    }

    @Test(
        "the first event of an unprepared snapshot and of a prepared one are the same bytes; the prepared copy's event is the shared rendering's"
    )
    func preparedAndUnpreparedAgree() {
        for version in UInt64(0)..<40 {
            let plain = Self.snapshot(version, prepared: false)
            let prepared = plain.prepared()
            #expect(prepared == plain)
            #expect(prepared.event == plain.event)
            #expect(prepared.prepared().event == plain.event)
            #expect(string(plain.event) == expectedEvent(version, plain.token))
            // A copy made before prepared() and read after it renders the same bytes.
            let late = TokenSnapshot(version: version, token: plain.token)
            let copy = late
            _ = late.prepared()
            #expect(copy.event == plain.event)
        }
    }

    @Test(
        "threads offering newer and older versions, heartbeats and a reader with a 7-byte buffer: whole events, ids strictly increasing, the last one written, the tally adds up"
    )
    func threadedOffersAndReader() {
        for round in 0..<4 {
            let tally = DeliveryTally()
            let wakes = DispatchSemaphore(value: 0)
            let subscriber = EventSubscriber(
                id: UInt64(round), first: TokenSnapshot(version: 0, token: nil), tally: tally,
                preamble: round % 2 == 0 ? utf8("retry: 9\n\n") : [], floor: round == 3 ? 50 : nil,
                wake: { wakes.signal() })
            let next = Locked<UInt64>(1)
            let top: UInt64 = 3_000
            let offered = Locked(0)
            let readerOutput = Locked<([UInt8], EventStreamRead)?>(nil)
            let readerDone = DispatchSemaphore(value: 0)
            // Threads of their own (not the cooperative pool, which the reader's wait would block).
            Thread.detachNewThread {
                var bytes: [UInt8] = []
                while true {
                    let step = readOnce(subscriber, size: 7)
                    switch step.result {
                    case .bytes: bytes += step.bytes
                    case .suspended: wakes.wait()
                    case .endOfStream, .abort:
                        let last = step.result
                        readerOutput.withLock { $0 = (bytes, last) }
                        readerDone.signal()
                        return
                    }
                }
            }
            let writers = DispatchGroup()
            for writer in 0..<2 {
                writers.enter()
                Thread.detachNewThread {
                    defer { writers.leave() }
                    while true {
                        let version = next.withLock { value -> UInt64 in
                            defer { value += 1 }
                            return value
                        }
                        if version > top { return }
                        // Every 11th offer repeats an older version; half the snapshots are prepared.
                        let offeredVersion = version % 11 == 0 ? version / 2 : version
                        let snapshot = TokenSnapshot(
                            version: offeredVersion, token: lowerHex([UInt8(truncatingIfNeeded: offeredVersion)]))
                        offered.withLock { $0 += 1 }
                        if subscriber.offer((version + UInt64(writer)) % 2 == 0 ? snapshot.prepared() : snapshot) {
                            subscriber.wake()
                        }
                    }
                }
            }
            writers.enter()
            Thread.detachNewThread {
                defer { writers.leave() }
                for _ in 0..<500 where subscriber.heartbeatTick() { subscriber.wake() }
            }
            writers.wait()
            // The last version is offered by now, and is the newest: it is pending or written.
            if subscriber.offer(TokenSnapshot(version: top + 1, token: "ff")) { subscriber.wake() }
            if subscriber.end(.finish, reason: .shutdown) { subscriber.wake() }
            readerDone.wait()
            guard let (bytes, result) = readerOutput.withLock({ $0 }) else { return }
            #expect(result == .endOfStream)
            var text = string(bytes)
            if round % 2 == 0 {
                #expect(text.hasPrefix("retry: 9\n\n"))
                text.removeFirst("retry: 9\n\n".count)
            }
            var ids: [UInt64] = []
            for block in text.components(separatedBy: "\n\n").dropLast() {
                if block == ": keep-alive" { continue }
                guard let id = block.split(separator: "\n").first.flatMap({ UInt64($0.dropFirst(4)) }) else {
                    Issue.record("round \(round): not an event: \(block.debugDescription)")
                    return
                }
                let token: String? =
                    id == 0 ? nil : id == top + 1 ? "ff" : lowerHex([UInt8(truncatingIfNeeded: id)])
                #expect(block + "\n\n" == expectedEvent(id, token), "round \(round): a cut or mixed event")
                ids.append(id)
            }
            #expect(text.hasSuffix("\n\n") || text.isEmpty)
            #expect(zip(ids, ids.dropFirst()).allSatisfy { $0 < $1 }, "round \(round): ids \(ids.prefix(40))")
            #expect(ids.last == top + 1)
            if round == 3 { #expect(ids.allSatisfy { $0 >= 50 }, "below the floor") }
            let counts = tally.counts
            #expect(counts.sent == UInt64(ids.count), "round \(round)")
            #expect(counts.sent + counts.skipped <= UInt64(offered.withLock { $0 }) + 2, "round \(round)")
        }
    }
}
