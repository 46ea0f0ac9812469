import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Rule 8: subscriptions are removed promptly; the manager's deinit finishes open streams; streams
/// do not keep the manager alive.
@Suite("Rule 8: cleanup", hangGuard())
struct CleanupTests {
    @Test func cancelledConsumerIsRemovedByTheTimeItsTaskFinishes() async {
        let manager = PushTokenManager(logHandler: silent)
        let (received, signal) = AsyncStream.makeStream(of: Void.self)
        let consumer = Task {
            for await _ in manager.tokenStream {
                signal.yield()
            }
        }
        var iterator = received.makeAsyncIterator()
        await iterator.next()  // subscribed and got the initial value
        #expect(manager.subscriberCount == 1)
        consumer.cancel()
        await consumer.value
        #expect(manager.subscriberCount == 0)
    }

    @Test func thousandSubscribeCancelCyclesLeaveNoSubscriber() async {
        let manager = PushTokenManager(logHandler: silent)
        for cycle in 0..<1000 {
            let consumer = Task {
                for await _ in manager.tokenStream {}
            }
            if cycle.isMultiple(of: 2) {
                // Half the time, cancel once subscribed; otherwise possibly before it starts.
                await waitUntil(#"manager.subscriberCount == 1"#) { manager.subscriberCount == 1 }
            }
            consumer.cancel()
            await consumer.value
            #expect(manager.subscriberCount == 0)
        }
        #expect(manager.subscriberCount == 0)
    }

    @Test func concurrentSubscribeCancelCyclesLeaveNoSubscriber() async {
        let manager = PushTokenManager(logHandler: silent)
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<1000 {
                group.addTask {
                    for await value in manager.tokenStream where value == hex(UInt32(index)) {
                        break
                    }
                }
            }
            for index in 0..<1000 {
                manager.didRegister(deviceToken: token(UInt32(index)))
            }
            group.cancelAll()
        }
        #expect(manager.subscriberCount == 0)
    }

    @Test func streamDroppedWithoutIterationIsRemoved() {
        let manager = PushTokenManager(logHandler: silent)
        _ = manager.tokenStream
        #expect(manager.subscriberCount == 0)
        do {
            let stream = manager.tokenStream
            #expect(manager.subscriberCount == 1)
            withExtendedLifetime(stream) {}
        }
        #expect(manager.subscriberCount == 0)
    }

    @Test func breakingOutOfTheLoopRemovesTheSubscription() async {
        let manager = PushTokenManager(logHandler: silent)
        for await value in manager.tokenStream {
            #expect(value == nil)
            #expect(manager.subscriberCount == 1)
            break
        }
        #expect(manager.subscriberCount == 0)
    }

    @Test func deinitEndsAWaitingLoop() async {
        var manager: PushTokenManager? = PushTokenManager(logHandler: silent)
        let weakManager = WeakReference(manager)
        manager!.didRegister(deviceToken: token(1))
        let stream = manager!.tokenStream
        let (received, signal) = AsyncStream.makeStream(of: Void.self)
        let loop = Task {
            var seen: [String?] = []
            for await value in stream {
                seen.append(value)
                signal.yield()
            }
            return seen
        }
        var iterator = received.makeAsyncIterator()
        await iterator.next()
        manager = nil
        #expect(weakManager.value == nil)
        #expect(await value(of: loop) == [hex(1)])
    }

    @Test func deinitDeliversTheBufferedValueThenEnds() async {
        var manager: PushTokenManager? = PushTokenManager(logHandler: silent)
        let stream = manager!.tokenStream
        manager!.didRegister(deviceToken: token(2))
        manager = nil
        var seen: [String?] = []
        for await value in stream {
            seen.append(value)
        }
        #expect(seen == [hex(2)])
    }

    @Test func streamsDoNotKeepTheManagerAlive() async {
        var manager: PushTokenManager? = PushTokenManager(logHandler: silent)
        let weakManager = WeakReference(manager)
        let streams = (0..<3).map { _ in manager!.tokenStream }
        #expect(weakManager.value?.subscriberCount == 3)
        manager = nil
        #expect(weakManager.value == nil)
        for stream in streams {
            var iterator = stream.makeAsyncIterator()
            #expect(await iterator.next() == .some(nil))
            #expect(await iterator.next() == nil)
        }
    }

    @Test func streamOutlivingItsManagerCanBeDroppedAndCancelled() async {
        var manager: PushTokenManager? = PushTokenManager(logHandler: silent)
        let weakManager = WeakReference(manager)
        manager!.didRegister(deviceToken: token(3))
        let read = manager!.tokenStream
        let cancelled = manager!.tokenStream
        var dropped: AsyncStream<String?>? = manager!.tokenStream
        manager = nil
        #expect(weakManager.value == nil)  // no stream kept it alive

        // Dropped after the manager: its termination handler runs, finds no manager (its weak
        // reference to the state is gone), and does nothing; a trap would end the test run.
        let terminations = Locked(0)
        var probe: AsyncStream<String?>? = AsyncStream { continuation in
            continuation.onTermination = { _ in terminations.withLock { $0 += 1 } }
        }
        dropped = nil
        probe = nil
        #expect(terminations.withLock { $0 } == 1)  // dropping a stream runs its termination handler
        withExtendedLifetime((dropped, probe)) {}

        // Read after the manager is gone: the value it had buffered, then the end.
        var seen: [String?] = []
        for await value in read {
            seen.append(value)
        }
        #expect(seen == [hex(3)])

        // Iterated by a cancelled task: the loop ends, with at most the buffered value.
        let consumer = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            var values: [String?] = []
            for await value in cancelled {
                values.append(value)
            }
            return values
        }
        #expect([[], [hex(3)]].contains(await consumer.value))
    }
}
