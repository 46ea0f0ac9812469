import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

typealias RetryPolicy = PushTokenManager.UploadRetryPolicy

/// `uploadTokenChanges` on a manual clock and a scripted backend: nothing here sleeps.
@Suite("Uploading token changes", .timeLimit(.minutes(1)))
struct TokenUploadTests {
    /// A running `uploadTokenChanges` with its manager, clock, backend and log.
    struct Harness {
        let manager: PushTokenManager
        let clock: ManualClock
        let backend: ScriptedBackend
        let log: LogRecorder
        let task: Task<Void, Never>

        init(
            policy: RetryPolicy = try! RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(8), jitter: 0),
            random: [UInt64] = [0],
            automatic: Bool = false,
            register initial: UInt32? = nil
        ) {
            let log = LogRecorder()
            let manager = PushTokenManager(logHandler: log.handler)
            if let initial { manager.didRegister(deviceToken: token(initial)) }
            let backend = ScriptedBackend(automatic: automatic)
            let clock = ManualClock()
            self.log = log
            self.manager = manager
            self.backend = backend
            self.clock = clock
            self.task = Task {
                await manager.uploadTokenChanges(
                    retryPolicy: policy, clock: clock, randomSource: ScriptedRandom(values: random),
                    upload: backend.upload)
            }
        }

        /// Waits until the uploader sleeps on the clock, and returns the duration it asked for.
        func nextSleep(sourceLocation: SourceLocation = #_sourceLocation) async -> Duration? {
            await waitUntil({ clock.sleeperCount == 1 }, sourceLocation: sourceLocation)
            return clock.requestedSleeps.last
        }

        /// Cancels the uploader and waits for it to return.
        func stop() async {
            task.cancel()
            await value(of: task)
        }
    }

    @Test func successOnTheFirstTry() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let call = try #require(await harness.backend.nextCall())
        #expect(call.value == hex(0xa))
        call.succeed()
        await letOtherTasksRun()
        #expect(harness.backend.values == [hex(0xa)])
        #expect(harness.clock.requestedSleeps.isEmpty)
        #expect(harness.log.recorded.isEmpty)
        await harness.stop()
    }

    @Test func theInitialNilIsNotUploadedButNilAfterATokenIs() async throws {
        let harness = Harness()
        await letOtherTasksRun()
        #expect(harness.backend.values.isEmpty)  // the launch's nil: nothing uploaded

        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        #expect(first.value == hex(0xa))
        first.succeed()

        harness.manager.didFailToRegister(error: TestError(description: "offline"))
        let second = try #require(await harness.backend.nextCall())
        #expect(second.value == nil)  // clears the token on the server
        second.succeed()
        await letOtherTasksRun()
        #expect(harness.backend.values == [hex(0xa), nil])
        await harness.stop()
    }

    @Test func aTokenPresentAtTheStartIsUploaded() async throws {
        let harness = Harness(register: 0x5)
        let call = try #require(await harness.backend.nextCall())
        #expect(call.value == hex(0x5))
        call.succeed()
        await harness.stop()
    }

    @Test func failuresAreRetriedOnTheDocumentedSchedule() async throws {
        // 1 s doubling to 8 s, half jitter. Random values: u = 0 (no jitter), u = 0.5, u just
        // below 1 (the most jitter), then u = 0.
        let policy = try RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(8), jitter: 0.5)
        let harness = Harness(policy: policy, random: [0, 1 << 63, .max, 0, 0])
        harness.manager.didRegister(deviceToken: token(0xa))
        let rejected = TestError(description: "503 for token \(hex(0xa))")

        var waits: [Duration] = []
        for _ in 0..<5 {
            let call = try #require(await harness.backend.nextCall())
            #expect(call.value == hex(0xa))
            call.fail(rejected)
            let wait = try #require(await harness.nextSleep())
            waits.append(wait)
            // Not retried before the wait is over...
            harness.clock.advance(by: wait - .nanoseconds(1))
            await letOtherTasksRun()
            #expect(harness.backend.waitingCount == 0)
            // ...and retried as soon as it is.
            harness.clock.advance(by: .nanoseconds(1))
        }
        let last = try #require(await harness.backend.nextCall())
        last.succeed()
        await letOtherTasksRun()

        // base 1, 2, 4, 8, 8 seconds (capped), each × (1 − 0.5 × u).
        #expect(waits[0] == .seconds(1))
        #expect(waits[1] == .milliseconds(1500))
        #expect(waits[2] >= .seconds(2) && waits[2] < .milliseconds(2001))
        #expect(waits[3] == .seconds(8))
        #expect(waits[4] == .seconds(8))
        #expect(harness.backend.values == Array(repeating: hex(0xa), count: 6))
        #expect(harness.clock.sleeperCount == 0)

        // Every failure logged as an error, counted, without the token's text.
        let messages = harness.log.recorded
        #expect(messages.count == 5)
        #expect(messages.allSatisfy { $0.level == .error && !$0.message.contains(hex(0xa)) })
        #expect(
            messages.first?.message
                == "device token upload failed (attempt 1): 503 for token <device token>; retrying in 1.0 seconds")
        #expect(messages.last?.message.hasPrefix("device token upload failed (attempt 5): ") == true)
        await harness.stop()
    }

    @Test func jitterStaysWithinItsBounds() throws {
        let policy = try RetryPolicy(initialDelay: .milliseconds(100), maximumDelay: .seconds(300), jitter: 0.3)
        // Not `SystemRandomNumberGenerator` itself: passing a local of that zero-sized type to a
        // generic inout parameter crashes the Thread Sanitizer build (its instrumentation writes
        // the shadow of an address that was never allocated).
        var random = DrawCounting(base: SystemRandomNumberGenerator())
        for retry in 1...40 {
            var base = Duration.milliseconds(100)
            for _ in 1..<retry { base = min(base * 2, .seconds(300)) }
            for _ in 0..<50 {
                let wait = policy.delay(forRetry: retry, using: &random)
                #expect(wait <= base)
                #expect(wait >= base * 0.7 - .nanoseconds(1))
            }
        }
        #expect(random.draws == 40 * 50)  // one value per wait
        var zero = ScriptedRandom(values: [0])
        #expect(policy.delay(forRetry: 0, using: &zero) == .milliseconds(100))
        #expect(policy.delay(forRetry: .max, using: &zero) == .seconds(300))
    }

    @Test func theStandardPolicyAndInvalidPolicies() {
        let standard = RetryPolicy.standard
        #expect(standard.initialDelay == .seconds(1))
        #expect(standard.maximumDelay == .seconds(300))
        #expect(standard.jitter == 0.5)
        #expect(throws: RetryPolicy.InvalidValue.self) {
            try RetryPolicy(initialDelay: .zero, maximumDelay: .seconds(1), jitter: 0)
        }
        #expect(throws: RetryPolicy.InvalidValue.self) {
            try RetryPolicy(initialDelay: .seconds(2), maximumDelay: .seconds(1), jitter: 0)
        }
        #expect(throws: RetryPolicy.InvalidValue.self) {
            try RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(1), jitter: 1.5)
        }
        #expect(throws: RetryPolicy.InvalidValue.self) {
            try RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(1), jitter: .nan)
        }
    }

    @Test func aNewerValueDuringABackoffWaitGoesAtOnceAndTheOldOneNeverAgain() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).fail(TestError(description: "down"))
        #expect(await harness.nextSleep() == .seconds(1))

        harness.manager.didRegister(deviceToken: token(0xb))  // no clock movement
        let call = try #require(await harness.backend.nextCall())
        #expect(call.value == hex(0xb))
        call.succeed()
        await waitUntil { harness.clock.sleeperCount == 0 }

        harness.clock.advance(by: .seconds(3600))
        await letOtherTasksRun()
        #expect(harness.backend.values == [hex(0xa), hex(0xb)])
        await harness.stop()
    }

    @Test func aNewerValueDuringASuccessfulUploadFollowsWhenItReturns() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        harness.manager.didRegister(deviceToken: token(0xb))
        await letOtherTasksRun()
        #expect(harness.backend.values == [hex(0xa)])  // no second upload while one is in flight
        first.succeed()
        let second = try #require(await harness.backend.nextCall())
        #expect(second.value == hex(0xb))
        second.succeed()
        await letOtherTasksRun()
        #expect(harness.backend.maximumInFlight == 1)
        #expect(harness.clock.requestedSleeps.isEmpty)
        await harness.stop()
    }

    @Test func aNewerValueDuringAFailingUploadReplacesItWithoutWaiting() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        harness.manager.didRegister(deviceToken: token(0xb))
        first.fail(TestError(description: "down"))
        let second = try #require(await harness.backend.nextCall())
        #expect(second.value == hex(0xb))
        second.succeed()
        await letOtherTasksRun()
        #expect(harness.clock.requestedSleeps.isEmpty)
        #expect(harness.backend.values == [hex(0xa), hex(0xb)])
        #expect(
            harness.log.recorded.map(\.message)
                == ["device token upload failed (attempt 1): down; a newer value replaces it"])
        await harness.stop()
    }

    @Test func cancellationDuringABackoffWaitReturnsPromptly() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).fail(TestError(description: "down"))
        _ = await harness.nextSleep()
        await harness.stop()  // returns without the clock moving
        #expect(harness.clock.sleeperCount == 0)
        harness.clock.advance(by: .seconds(3600))
        harness.manager.didRegister(deviceToken: token(0xb))
        await letOtherTasksRun()
        #expect(harness.backend.values == [hex(0xa)])
        #expect(harness.manager.subscriberCount == 0)
    }

    @Test func cancellationDuringAnUploadReturnsPromptly() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        _ = try #require(await harness.backend.nextCall())  // never answered
        await harness.stop()  // the upload sees the cancellation and throws
        #expect(harness.backend.cancelledCount == 1)
        harness.manager.didRegister(deviceToken: token(0xb))
        await letOtherTasksRun()
        #expect(harness.backend.values == [hex(0xa)])
        #expect(harness.clock.requestedSleeps.isEmpty)
        #expect(harness.log.recorded.isEmpty)  // a cancelled upload is not a failure
        #expect(harness.manager.subscriberCount == 0)
    }

    @Test func tenThousandChangesDuringOneUploadLeaveOnlyTheNewest() async throws {
        // Bounded memory: while one upload is in flight, 10,000 changes leave one value waiting,
        // the newest, not a queue.
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(1))
        let first = try #require(await harness.backend.nextCall())
        for n in 2...10_001 {
            harness.manager.didRegister(deviceToken: token(UInt32(n)))
        }
        first.succeed()
        let second = try #require(await harness.backend.nextCall())
        #expect(second.value == hex(10_001))
        second.succeed()
        await letOtherTasksRun()
        #expect(harness.backend.values == [hex(1), hex(10_001)])
        await harness.stop()
    }

    @Test func tenThousandRapidChangesFromAnotherThreadNeverOverlap() async {
        let harness = Harness(automatic: true)
        let manager = harness.manager
        await runOnThreads(1) { _ in
            for n in 1...10_000 {
                manager.didRegister(deviceToken: token(UInt32(n)))
            }
        }
        await waitUntil { harness.backend.values.last == hex(10_000) }
        let values = harness.backend.values
        #expect(harness.backend.maximumInFlight == 1)
        // In order, never an older value after a newer one.
        #expect(values.map(number) == values.map(number).sorted())
        #expect(Set(values).count == values.count)
        await harness.stop()
    }

    @Test func aValueAlreadyOnTheServerIsNotUploadedAgain() async throws {
        // A, then B (its upload fails and is abandoned for A again): A must go again, because the
        // server's state is unknown after a failed attempt of B.
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).succeed()
        harness.manager.didRegister(deviceToken: token(0xb))
        let b = try #require(await harness.backend.nextCall())
        harness.manager.didRegister(deviceToken: token(0xa))
        b.fail(TestError(description: "down"))
        let again = try #require(await harness.backend.nextCall())
        #expect(again.value == hex(0xa))
        again.succeed()
        await letOtherTasksRun()
        #expect(harness.backend.values == [hex(0xa), hex(0xb), hex(0xa)])
        await harness.stop()
    }
}

/// A random source that counts its draws.
struct DrawCounting<Base: RandomNumberGenerator>: RandomNumberGenerator {
    var base: Base
    var draws = 0

    mutating func next() -> UInt64 {
        draws += 1
        return base.next()
    }
}
