import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Races on plain threads, started together by a spin barrier, to hit narrow windows.
@Suite("Races between threads", hangGuard())
struct RaceTests {
    /// Rule 4: reading the current value and attaching the subscriber are one atomic step, so a
    /// change racing with a subscription is never lost.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aChangeRacingWithASubscriptionIsNeverLost() async {
        let rounds = 20_000
        let managers = (0..<rounds).map { _ in
            let manager = PushTokenManager(logHandler: silent)
            manager.didRegister(deviceToken: token(1))
            return manager
        }
        let streams = Locked<[AsyncStream<String?>?]>(Array(repeating: nil, count: rounds))
        let barrier = SpinBarrier(parties: 2)
        await runOnThreads(2) { role in
            for round in 0..<rounds {
                barrier.arriveAndWait()
                if role == 0 {
                    let stream = managers[round].tokenStream
                    streams.withLock { $0[round] = stream }
                } else {
                    managers[round].didRegister(deviceToken: token(2))
                }
            }
        }
        _ = consume managers  // deinitialises them all, which finishes every stream
        var lost = 0
        for stream in streams.withLock({ $0 }) {
            // Nobody read the stream, so its one-value buffer holds the newest value it was given:
            // 2 unless the change was lost.
            var elements: [String?] = []
            for await value in stream! {
                elements.append(value)
            }
            if elements != [hex(2)] { lost += 1 }
        }
        #expect(lost == 0)
    }

    /// Rules 5 and 6: with producers racing, every subscriber still ends on the current token
    /// (a late delivery of an older value would leave it behind).
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func subscribersConvergeOnTheTokenAfterConcurrentChanges() async {
        let manager = PushTokenManager(logHandler: silent)
        let subscribers = 8
        let lastSeen = Locked<[String?]>(Array(repeating: "none yet", count: subscribers))
        let consumers = (0..<subscribers).map { index in
            Task {
                for await value in manager.tokenStream {
                    lastSeen.withLock { $0[index] = value }
                }
            }
        }
        let writers = 4
        let barrier = SpinBarrier(parties: writers)
        for round in 0..<300 as Range<UInt32> {
            await runOnThreads(writers) { writer in
                barrier.arriveAndWait()
                if writer == 0, round.isMultiple(of: 7) {
                    manager.didFailToRegister(error: TestError(description: "round \(round)"))
                } else {
                    manager.didRegister(deviceToken: token(round << 8 | UInt32(writer)))
                }
            }
            // Every subscriber must reach the final value: waits for that event (a lost value is a
            // hang, which the suite's time limit turns into a failure), not for a deadline.
            let current = manager.token
            await waitUntil(#"lastSeen.withLock { $0.allSatisfy { $0 == current } }"#) {
                lastSeen.withLock { $0.allSatisfy { $0 == current } }
            }
            let behind = lastSeen.withLock { $0.filter { $0 != current }.count }
            #expect(behind == 0, "round \(round): \(behind) subscribers did not reach \(current ?? "nil")")
            if behind > 0 { break }
        }
        for consumer in consumers {
            consumer.cancel()
            await consumer.value
        }
        #expect(manager.subscriberCount == 0)
    }
}

/// A reusable barrier for a fixed number of threads that spins (threads only, never tasks).
///
/// A `Locked` counter, not `Synchronization.Atomic` (macOS 15 / iOS 18), so it builds for the
/// package's macOS 12.
final class SpinBarrier: Sendable {
    private let parties: Int
    private let arrived = Locked(0)

    init(parties: Int) {
        self.parties = parties
    }

    /// Waits until all parties of the current generation have arrived.
    func arriveAndWait() {
        let ticket = arrived.withLock {
            $0 += 1
            return $0
        }
        let target = (ticket + parties - 1) / parties * parties
        while arrived.withLock({ $0 }) < target {}
    }
}
