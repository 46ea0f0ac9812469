import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Regression test for a lock-order inversion between the manager's state lock and the Swift
/// runtime's per-task status-record lock.
///
/// Cancelling a task runs its cancellation handlers while holding that task's status-record
/// lock; for a task suspended in `AsyncStream`'s `next()`, that handler terminates the stream
/// and runs `onTermination` synchronously, which takes the state lock to remove the subscriber.
/// Resuming that same task from `yield` takes its status-record lock. So `yield` must never be
/// called while holding the state lock that `onTermination` takes; with that mistake this test
/// hangs within a few hundred rounds.
@Suite("Yield racing with cancellation", hangGuard())
struct DeadlockRegressionTests {
    @Test func yieldRacingWithConsumerCancellationDoesNotDeadlock() async {
        let manager = PushTokenManager(logHandler: silent)
        for round in 0..<3_000 as Range<UInt32> {
            let consumer = Task {
                for await _ in manager.tokenStream {}
            }
            await waitUntil(#"manager.subscriberCount == 1"#) { manager.subscriberCount == 1 }
            await runOnThreads(2) { role in
                if role == 0 {
                    for step in 1...8 as ClosedRange<UInt32> {
                        manager.didRegister(deviceToken: token(round << 8 | step))
                    }
                } else {
                    consumer.cancel()
                }
            }
            await consumer.value
            #expect(manager.subscriberCount == 0)
        }
    }
}
