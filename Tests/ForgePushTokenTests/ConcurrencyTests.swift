import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Rules 4, 5, 6 and 9 under concurrency.
@Suite("Concurrency", hangGuard())
struct ConcurrencyTests {
    /// Rule 6: a subscriber that does not read keeps only the newest value.
    @Test func slowSubscriberReceivesOnlyTheNewestValue() async {
        var manager: PushTokenManager? = PushTokenManager(logHandler: silent)
        let stream = manager!.tokenStream
        for n in 1...10_000 as ClosedRange<UInt32> {
            manager!.didRegister(deviceToken: token(n))
        }
        var iterator = stream.makeAsyncIterator()
        #expect(await iterator.next() == .some(hex(10_000)))
        // Finishing the stream delivers whatever is still buffered before ending: nothing is.
        manager = nil
        #expect(await iterator.next() == nil)
    }

    /// Rules 5 and 6: a subscriber that reads slowly while changes pour in never receives an older
    /// value after a newer one, and ends on the newest.
    @Test func slowReaderSeesIncreasingValuesEndingOnTheNewest() async {
        let manager = PushTokenManager(logHandler: silent)
        let last: UInt32 = 10_000
        let reader = Task {
            var seen: [UInt32] = []
            for await value in manager.tokenStream {
                seen.append(number(value))
                if seen.last == last { break }
                await Task.yield()
            }
            return seen
        }
        await waitUntil(#"manager.subscriberCount == 1"#) { manager.subscriberCount == 1 }
        for n in 1...last {
            manager.didRegister(deviceToken: token(n))
        }
        let seen = await value(of: reader)
        #expect(seen.last == last)
        #expect(zip(seen, seen.dropFirst()).allSatisfy { $0 < $1 })
    }

    /// Rule 4: a change racing with a subscription is seen exactly once, as the first element or
    /// as the second: never lost, never doubled.
    @Test func changeRacingWithSubscriptionIsSeenExactlyOnce() async {
        var outcomes: [[String?]: Int] = [:]
        for _ in 0..<2_000 {
            let (stream, first) = await raceSubscriptionWithChange()
            // The manager is gone: its deinit finished the stream, which delivers anything still
            // buffered and then ends.
            var elements: [String?] = [first]
            for await value in stream {
                elements.append(value)
            }
            outcomes[elements, default: 0] += 1
        }
        let allowed: Set<[String?]> = [[hex(1), hex(2)], [hex(2)]]
        #expect(Set(outcomes.keys).isSubset(of: allowed), "outcomes: \(outcomes)")
    }

    /// Subscribes and changes the token concurrently on a manager holding token 1; returns the
    /// subscription and the first element it received. The manager is deinitialised on return.
    private func raceSubscriptionWithChange() async -> (AsyncStream<String?>, String?) {
        let manager = PushTokenManager(logHandler: silent)
        manager.didRegister(deviceToken: token(1))
        return await withTaskGroup(of: (AsyncStream<String?>, String?)?.self) { group in
            group.addTask {
                let stream = manager.tokenStream
                var iterator = stream.makeAsyncIterator()
                return await (stream, iterator.next()!)
            }
            group.addTask {
                manager.didRegister(deviceToken: token(2))
                return nil
            }
            var result: (AsyncStream<String?>, String?)?
            for await value in group where value != nil {
                result = value
            }
            return result!
        }
    }

    /// Rules 5, 7, 8: one writer takes the token through 1…N while subscribers come and go. Each
    /// subscription sees strictly increasing values; a later subscription by the same task never
    /// starts below what an earlier one saw; the long-lived ones end on N; none is left behind.
    @Test func subscribersComingAndGoingSeeChangesInOrder() async {
        let manager = PushTokenManager(logHandler: silent)
        let last: UInt32 = 5_000
        let violations = await withTaskGroup(of: [String].self) { group in
            for subscriber in 0..<16 {
                group.addTask {
                    var violations: [String] = []
                    var highest: UInt32 = 0
                    var round = 0
                    while highest < last {
                        round += 1
                        // Short-lived subscriptions for the odd subscribers' first rounds.
                        let budget = subscriber % 2 == 1 && round < 50 ? 1 + round % 4 : Int.max
                        var previous: UInt32?
                        var taken = 0
                        for await value in manager.tokenStream {
                            let n = number(value)
                            if let previous, n <= previous {
                                violations.append("subscriber \(subscriber): \(n) after \(previous)")
                            }
                            if previous == nil, n < highest {
                                violations.append("subscriber \(subscriber): started at \(n) after seeing \(highest)")
                            }
                            previous = n
                            highest = max(highest, n)
                            taken += 1
                            if n == last || taken == budget { break }
                        }
                    }
                    return violations
                }
            }
            group.addTask {
                for n in 1...last {
                    manager.didRegister(deviceToken: token(n))
                    if n.isMultiple(of: 64) { await Task.yield() }
                }
                return []
            }
            return await group.reduce(into: []) { $0 += $1 }
        }
        #expect(violations.isEmpty)
        #expect(manager.token == hex(last))
        #expect(manager.subscriberCount == 0)
    }

    /// Rules 5, 8, 9: several writers and failures race with subscribers that subscribe, cancel or
    /// stay; no deadlock, each subscriber sees each writer's tokens in that writer's order, the
    /// ones that stay converge on the final token, and no subscription is left behind.
    @Test func concurrentWritersAndSubscribers() async {
        let manager = PushTokenManager(logHandler: silent)
        let writers: UInt32 = 4
        let perWriter: UInt32 = 1_000
        let final: UInt32 = 0xffff_ffff
        let stayers = 8
        // Writer w registers w << 24 | i for i in 1...perWriter, in order.
        let stayerResults = await withTaskGroup(of: [String].self) { group in
            for _ in 0..<stayers {
                group.addTask {
                    var violations: [String] = []
                    var lastByWriter: [UInt32: UInt32] = [:]
                    for await value in manager.tokenStream {
                        let n = number(value)
                        if n == final { return violations }
                        guard value != nil else { continue }
                        let (writer, sequence) = (n >> 24, n & 0xff_ffff)
                        if let previous = lastByWriter[writer], sequence <= previous {
                            violations.append("writer \(writer): \(sequence) after \(previous)")
                        }
                        lastByWriter[writer] = sequence
                    }
                    violations.append("stream ended before the final token")
                    return violations
                }
            }
            await waitUntil(#"manager.subscriberCount == stayers"#) { manager.subscriberCount == stayers }

            // Subscribers that leave: by cancellation (unstructured tasks) and by breaking.
            let leavers = (0..<200).map { index in
                Task {
                    for await value in manager.tokenStream {
                        if index.isMultiple(of: 2), value != nil { break }
                    }
                }
            }
            await withTaskGroup(of: Void.self) { writersGroup in
                for writer in 1...writers {
                    writersGroup.addTask {
                        for sequence in 1...perWriter {
                            manager.didRegister(deviceToken: token(writer << 24 | sequence))
                            if sequence.isMultiple(of: 97) {
                                manager.didFailToRegister(error: TestError(description: "writer \(writer)"))
                            }
                            if sequence.isMultiple(of: 16) { await Task.yield() }
                        }
                    }
                }
                for (index, leaver) in leavers.enumerated() where !index.isMultiple(of: 2) {
                    leaver.cancel()
                    await Task.yield()
                }
            }
            for leaver in leavers {
                leaver.cancel()
                await leaver.value
            }
            manager.didRegister(deviceToken: token(final))
            return await group.reduce(into: []) { $0 += $1 }
        }
        #expect(stayerResults.isEmpty)
        #expect(manager.token == hex(final))
        #expect(manager.subscriberCount == 0)
    }

    /// Rule 9: `token` read right after `didRegister` returns reflects it, on every thread, and
    /// on another thread that has synchronised with the registering one.
    @Test func tokenReflectsTheRegistrationThatJustReturned() async {
        let mismatches = Locked(0)
        let shared = PushTokenManager(logHandler: silent)
        await runOnThreads(8) { thread in
            let own = PushTokenManager(logHandler: silent)
            for n in 1...2_000 as ClosedRange<UInt32> {
                let value = UInt32(thread) << 24 | n
                own.didRegister(deviceToken: token(value))
                shared.didRegister(deviceToken: token(value))
                if own.token != hex(value) { mismatches.withLock { $0 += 1 } }
                // Other threads write too: the shared token is some registered token, never torn.
                if let seen = shared.token, seen.count != 8 || number(seen) & 0xff_ffff == 0 {
                    mismatches.withLock { $0 += 1 }
                }
                if n.isMultiple(of: 500) {
                    own.didFailToRegister(error: TestError(description: "reset"))
                    if own.token != nil { mismatches.withLock { $0 += 1 } }
                }
            }
        }
        #expect(mismatches.withLock { $0 } == 0)

        // Hand-off: one thread registers, then signals; the other then reads.
        let manager = PushTokenManager(logHandler: silent)
        let registered = DispatchSemaphore(value: 0)
        let checked = DispatchSemaphore(value: 0)
        await runOnThreads(2) { role in
            for n in 1...2_000 as ClosedRange<UInt32> {
                if role == 0 {
                    manager.didRegister(deviceToken: token(n))
                    registered.signal()
                    checked.wait()
                } else {
                    registered.wait()
                    if manager.token != hex(n) { mismatches.withLock { $0 += 1 } }
                    checked.signal()
                }
            }
        }
        #expect(mismatches.withLock { $0 } == 0)
    }
}
