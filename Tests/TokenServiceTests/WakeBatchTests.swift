import Dispatch
import ForgePushToken
import Testing

@testable import ServerSupport

/// `WakeBatch`: wake-ups asked for during a batch reach each target once, after it.
@Suite struct WakeBatchTests {
    /// A target that counts its wake-ups.
    final class Target: BatchWakeable {
        let wakes = Locked(0)
        func wake() { wakes.withLock { $0 += 1 } }
    }

    @Test("outside a batch, the caller wakes the target itself")
    func outsideABatchNothingIsDeferred() {
        let target = Target()
        #expect(WakeBatch.wakeLater(target) == false)
        #expect(target.wakes.withLock { $0 } == 0)
    }

    @Test("inside a batch, each target is woken once, when the batch ends; a nested batch joins the outer one")
    func eachTargetIsWokenOnceAtTheEnd() {
        let first = Target()
        let second = Target()
        WakeBatch.run {
            #expect(WakeBatch.wakeLater(first))
            #expect(WakeBatch.wakeLater(second))
            WakeBatch.run {
                #expect(WakeBatch.wakeLater(first))
            }
            // The nested batch ended without waking: the outer one has not.
            #expect(first.wakes.withLock { $0 } == 0)
            #expect(WakeBatch.wakeLater(first))
        }
        #expect(first.wakes.withLock { $0 } == 1)
        #expect(second.wakes.withLock { $0 } == 1)
        // The batch is closed and empty: a second one starts afresh.
        WakeBatch.run { _ = WakeBatch.wakeLater(second) }
        #expect(first.wakes.withLock { $0 } == 1)
        #expect(second.wakes.withLock { $0 } == 2)
        #expect(WakeBatch.wakeLater(first) == false)
    }

    /// A target whose `wake()` runs a batch of its own on the same thread.
    final class Reentrant: BatchWakeable {
        let other: Target
        let wakes = Locked(0)
        init(other: Target) { self.other = other }
        func wake() {
            wakes.withLock { $0 += 1 }
            WakeBatch.run { _ = WakeBatch.wakeLater(other) }
        }
    }

    @Test("a wake() that runs a batch of its own leaves nothing behind: later batches wake only their own targets")
    func reentrantWakeLeavesNothingBehind() {
        // On a queue's thread, not the test's, so that a failure cannot leave targets in the
        // batch of a thread other tests run on.
        let counts = DispatchQueue(label: "test.wake-batch").sync { () -> [Int] in
            let other = Target()
            let reentrant = Reentrant(other: other)
            WakeBatch.run { _ = WakeBatch.wakeLater(reentrant) }
            // A second batch on the same thread, with a target of its own.
            let fresh = Target()
            WakeBatch.run { _ = WakeBatch.wakeLater(fresh) }
            return [reentrant.wakes.withLock { $0 }, other.wakes.withLock { $0 }, fresh.wakes.withLock { $0 }]
        }
        // The reentrant target once, the target of its own batch once, and nothing again.
        #expect(counts == [1, 1, 1])
    }

    @Test("a batch that throws still wakes its targets")
    func aThrowingBatchWakes() {
        struct Failure: Error {}
        let target = Target()
        #expect(throws: Failure.self) {
            try WakeBatch.run {
                _ = WakeBatch.wakeLater(target)
                throw Failure()
            }
        }
        #expect(target.wakes.withLock { $0 } == 1)
    }
}
