import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
typealias RetryPolicy = PushTokenManager.UploadRetryPolicy

/// `uploadTokenChanges` on a manual clock and a scripted backend: nothing here sleeps.
@Suite("Uploading token changes", hangGuard())
struct TokenUploadTests {
    /// A running `uploadTokenChanges` with its manager, clock, backend and log.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    struct Harness {
        let manager: PushTokenManager
        let clock: ManualClock
        let backend: ScriptedBackend
        let log: LogRecorder
        let task: Task<Void, Never>
        let record: any ServerRecordStore
        let wallClock: WallClock
        let authorization: FakeAuthorization

        init(
            policy: RetryPolicy = try! RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(8), jitter: 0),
            random: [UInt64] = [0],
            automatic: Bool = false,
            environment: APNsEnvironment? = .development,
            register initial: UInt32? = nil,
            record: any ServerRecordStore = MemoryServerRecordStore(),
            wallClock: WallClock = WallClock(),
            authorization: FakeAuthorization = FakeAuthorization(nil),
            manager given: PushTokenManager? = nil,
            log givenLog: LogRecorder? = nil
        ) {
            let log = givenLog ?? LogRecorder()
            let manager = given ?? PushTokenManager(logHandler: log.handler)
            if let initial { manager.didRegister(deviceToken: token(initial)) }
            let backend = ScriptedBackend(automatic: automatic)
            let clock = ManualClock()
            self.log = log
            self.manager = manager
            self.backend = backend
            self.clock = clock
            self.record = record
            self.wallClock = wallClock
            self.authorization = authorization
            self.task = Task {
                await manager.uploadTokenChanges(
                    retryPolicy: policy, environment: environment, serverRecord: record, clock: clock,
                    randomSource: ScriptedRandom(values: random), wallClock: wallClock.now,
                    authorization: authorization, upload: backend.upload)
            }
        }

        /// Waits until the uploader sleeps on the clock, and returns the duration it asked for.
        func nextSleep(sourceLocation: SourceLocation = #_sourceLocation) async -> Duration? {
            await waitUntil("the uploader to sleep on the clock", sourceLocation: sourceLocation) {
                clock.sleeperCount == 1
            }
            return clock.requestedSleeps.last
        }

        /// Waits until the uploader's mailbox holds `value` (the stream has delivered it).
        func waitUntilPending(_ value: String?, sourceLocation: SourceLocation = #_sourceLocation) async {
            await waitUntil(
                "the mailbox to hold \(String(describing: value))", sourceLocation: sourceLocation
            ) {
                // A value waiting is always the last one put (a put replaces what waits).
                guard let mailbox = manager.uploaderMailboxes.first else { return false }
                return mailbox.hasValue && mailbox.lastPut == .some(value)
            }
        }

        /// Waits until the uploader has taken the value its mailbox held.
        func waitUntilTaken(sourceLocation: SourceLocation = #_sourceLocation) async {
            await waitUntil("the uploader to take its mailbox's value", sourceLocation: sourceLocation) {
                guard let mailbox = manager.uploaderMailboxes.first else { return false }
                return !mailbox.hasValue
            }
        }

        /// Shows that the uploader does nothing more, by the event that must come next: `marker`
        /// is registered and the next call must upload it (anything the uploader did first would
        /// be that call instead); the call is answered `done`.
        func expectNothingMoreThen(_ marker: UInt32, sourceLocation: SourceLocation = #_sourceLocation) async throws {
            manager.didRegister(deviceToken: token(marker))
            let call = try #require(await backend.nextCall(), sourceLocation: sourceLocation)
            #expect(call.value == hex(marker), "an upload came before the next value's", sourceLocation: sourceLocation)
            call.succeed()
        }

        /// Cancels the uploader and waits for it to return.
        func stop() async {
            task.cancel()
            await value(of: task)
        }
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func successOnTheFirstTry() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let call = try #require(await harness.backend.nextCall())
        #expect(call.value == hex(0xa))
        call.succeed()
        try await harness.expectNothingMoreThen(0xb)
        #expect(harness.backend.values == [hex(0xa), hex(0xb)])
        #expect(harness.clock.requestedSleeps.isEmpty)
        #expect(harness.log.recorded.isEmpty)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func theInitialNilIsNotUploadedButNilAfterATokenIs() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        #expect(first.value == hex(0xa))  // the first call: the launch's nil was not uploaded
        first.succeed()

        harness.manager.didFailToRegister(error: TestError(description: "offline"))
        let second = try #require(await harness.backend.nextCall())
        #expect(second.value == nil)  // clears the token on the server
        second.succeed()
        try await harness.expectNothingMoreThen(0xc)
        #expect(harness.backend.values == [hex(0xa), nil, hex(0xc)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aTokenPresentAtTheStartIsUploaded() async throws {
        let harness = Harness(register: 0x5)
        let call = try #require(await harness.backend.nextCall())
        #expect(call.value == hex(0x5))
        call.succeed()
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
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
            // Not retried before the wait is over (the uploader still sleeps on the clock)...
            harness.clock.advance(by: wait - .nanoseconds(1))
            #expect(harness.clock.sleeperCount == 1)
            #expect(harness.backend.waitingCount == 0)
            // ...and retried as soon as it is.
            harness.clock.advance(by: .nanoseconds(1))
        }
        let last = try #require(await harness.backend.nextCall())
        last.succeed()
        try await harness.expectNothingMoreThen(0xb)

        // base 1, 2, 4, 8, 8 seconds (capped), each × (1 − 0.5 × u).
        #expect(waits[0] == .seconds(1))
        #expect(waits[1] == .milliseconds(1500))
        #expect(waits[2] >= .seconds(2) && waits[2] < .milliseconds(2001))
        #expect(waits[3] == .seconds(8))
        #expect(waits[4] == .seconds(8))
        #expect(harness.backend.values == Array(repeating: hex(0xa), count: 6) + [hex(0xb)])
        #expect(harness.clock.sleeperCount == 0)

        // Every failure logged as an error, counted, without the token's text.
        let messages = harness.log.recorded
        #expect(messages.count == 5)
        #expect(messages.allSatisfy { $0.level == .error && !$0.message.contains(hex(0xa)) })
        #expect(
            messages.first?.message
                == "device token upload failed (attempt 1): ForgePushTokenTests.TestError error 1; retrying in 1.0 seconds"
        )
        #expect(messages.last?.message.hasPrefix("device token upload failed (attempt 5): ") == true)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func jitterStaysWithinItsBounds() throws {
        let policy = try RetryPolicy(initialDelay: .milliseconds(100), maximumDelay: .seconds(300), jitter: 0.3)
        // Seeded, so a failure repeats; wrapped to count the draws.
        var random = DrawCounting(base: SeededGenerator(state: 0x00C0_FFEE))
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

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
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
        #expect(throws: RetryPolicy.InvalidValue.self) {
            try RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(1), jitter: 0, resendInterval: .zero)
        }
        // Issue 46: an unchanged token is re-sent daily by default (a server that pruned it gets
        // it back); a policy made without one turns it off.
        #expect(standard.resendInterval == .seconds(86_400))
        let off = try? RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(300), jitter: 0.5)
        #expect(off?.resendInterval == nil)
        #expect(off != standard)
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aNewerValueDuringABackoffWaitGoesAtOnceAndTheOldOneNeverAgain() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).fail(TestError(description: "down"))
        #expect(await harness.nextSleep() == .seconds(1))

        harness.manager.didRegister(deviceToken: token(0xb))  // no clock movement
        let call = try #require(await harness.backend.nextCall())
        #expect(call.value == hex(0xb))
        call.succeed()
        await waitUntil(#"harness.clock.sleeperCount == 0"#) { harness.clock.sleeperCount == 0 }

        harness.clock.advance(by: .seconds(3600))
        try await harness.expectNothingMoreThen(0xc)  // A is never retried
        #expect(harness.backend.values == [hex(0xa), hex(0xb), hex(0xc)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aNewerValueDuringASuccessfulUploadFollowsWhenItReturns() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        harness.manager.didRegister(deviceToken: token(0xb))
        await harness.waitUntilPending(hex(0xb))  // B waits while A's upload is in flight
        #expect(harness.backend.values == [hex(0xa)])
        first.succeed()
        let second = try #require(await harness.backend.nextCall())
        #expect(second.value == hex(0xb))
        second.succeed()
        try await harness.expectNothingMoreThen(0xc)
        #expect(harness.backend.maximumInFlight == 1)
        #expect(harness.clock.requestedSleeps.isEmpty)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aNewerValueDuringAFailingUploadReplacesItWithoutWaiting() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        harness.manager.didRegister(deviceToken: token(0xb))
        await harness.waitUntilPending(hex(0xb))  // B is waiting when A's upload fails
        first.fail(TestError(description: "down"))
        let second = try #require(await harness.backend.nextCall())
        #expect(second.value == hex(0xb))
        second.succeed()
        try await harness.expectNothingMoreThen(0xc)
        #expect(harness.clock.requestedSleeps.isEmpty)
        #expect(harness.backend.values == [hex(0xa), hex(0xb), hex(0xc)])
        #expect(
            harness.log.recorded.map(\.message)
                == [
                    "device token upload failed (attempt 1): ForgePushTokenTests.TestError error 1; a newer value replaces it"
                ])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func cancellationDuringABackoffWaitReturnsPromptly() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).fail(TestError(description: "down"))
        _ = await harness.nextSleep()
        await harness.stop()  // returns without the clock moving
        #expect(harness.clock.sleeperCount == 0)
        harness.clock.advance(by: .seconds(3600))
        harness.manager.didRegister(deviceToken: token(0xb))  // the uploader has returned
        #expect(harness.backend.values == [hex(0xa)])
        #expect(harness.manager.subscriberCount == 0)
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func cancellationDuringAnUploadReturnsPromptly() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        _ = try #require(await harness.backend.nextCall())  // never answered
        await harness.stop()  // the upload sees the cancellation and throws
        #expect(harness.backend.cancelledCount == 1)
        harness.manager.didRegister(deviceToken: token(0xb))  // the uploader has returned
        #expect(harness.backend.values == [hex(0xa)])
        #expect(harness.clock.requestedSleeps.isEmpty)
        #expect(harness.log.recorded.isEmpty)  // a cancelled upload is not a failure
        #expect(harness.manager.subscriberCount == 0)
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
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
        try await harness.expectNothingMoreThen(20_000)
        #expect(harness.backend.values == [hex(1), hex(10_001), hex(20_000)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func tenThousandRapidChangesFromAnotherThreadNeverOverlap() async {
        let harness = Harness(automatic: true)
        let manager = harness.manager
        await runOnThreads(1) { _ in
            for n in 1...10_000 {
                manager.didRegister(deviceToken: token(UInt32(n)))
            }
        }
        await waitUntil(#"harness.backend.values.last == hex(10_000)"#) { harness.backend.values.last == hex(10_000) }
        let values = harness.backend.values
        #expect(harness.backend.maximumInFlight == 1)
        // In order, never an older value after a newer one.
        #expect(values.map(number) == values.map(number).sorted())
        #expect(Set(values).count == values.count)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aValueAlreadyOnTheServerIsNotUploadedAgain() async throws {
        // A is uploaded; during its upload the token goes to B and back to A, so the uploader
        // next sees A, which the server holds: nothing is uploaded, and the next call is C's.
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        harness.manager.didRegister(deviceToken: token(0xb))
        harness.manager.didRegister(deviceToken: token(0xa))
        await harness.waitUntilPending(hex(0xa))  // B was taken over by A before the uploader saw it
        first.succeed()
        await harness.waitUntilTaken()  // the uploader took A
        harness.manager.didRegister(deviceToken: token(0xc))
        let next = try #require(await harness.backend.nextCall())
        #expect(next.value == hex(0xc))  // not A again
        #expect(next.request.serverToken == hex(0xa))
        next.succeed()
        #expect(harness.backend.values == [hex(0xa), hex(0xc)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aValueIsUploadedAgainWhenAnotherWasAttemptedSince() async throws {
        // A, then B (its upload fails and is abandoned for A again): A must go again, because the
        // server's state is unknown after a failed attempt of B.
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).succeed()
        harness.manager.didRegister(deviceToken: token(0xb))
        let b = try #require(await harness.backend.nextCall())
        harness.manager.didRegister(deviceToken: token(0xa))
        await harness.waitUntilPending(hex(0xa))  // A is waiting when B's upload fails
        b.fail(TestError(description: "down"))
        let again = try #require(await harness.backend.nextCall())
        #expect(again.value == hex(0xa))
        #expect(again.request.serverToken == hex(0xa))  // the last value answered done
        again.succeed()
        #expect(harness.backend.values == [hex(0xa), hex(0xb), hex(0xa)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func eachUploadIsToldTheServerTokenTheEnvironmentAndTheRegistrationError() async throws {
        let harness = Harness(environment: .production)
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        #expect(
            first.request
                == TokenUpload(token: hex(0xa), serverToken: nil, environment: .production, registrationError: nil))
        first.succeed()

        harness.manager.didRegister(deviceToken: token(0xb))
        let second = try #require(await harness.backend.nextCall())
        #expect(second.request.serverToken == hex(0xa))  // what to replace
        second.succeed()

        harness.manager.didFailToRegister(error: TestError(description: "no valid aps-environment"))
        let clear = try #require(await harness.backend.nextCall())
        #expect(
            clear.request
                == TokenUpload(
                    token: nil, serverToken: hex(0xb), environment: .production,
                    registrationError: "no valid aps-environment"))
        clear.succeed()

        // After a clear the server holds nothing; a new token says so, and carries no error.
        harness.manager.didRegister(deviceToken: token(0xc))
        let third = try #require(await harness.backend.nextCall())
        #expect(
            third.request
                == TokenUpload(token: hex(0xc), serverToken: nil, environment: .production, registrationError: nil))
        third.succeed()
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func withoutAnOverrideTheEnvironmentIsDecidedFromTheApp() async throws {
        // On Linux there is no provisioning profile: production, as for an App Store build.
        let harness = Harness(environment: nil, register: 0xa)
        let call = try #require(await harness.backend.nextCall())
        #expect(call.request.environment == .production)
        call.succeed()
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func givingUpStopsUntilTheValueChanges() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).answer(.giveUp)
        // The next call is B's: A was not retried in between, and no backoff wait was started.
        harness.manager.didRegister(deviceToken: token(0xb))
        let next = try #require(await harness.backend.nextCall())
        #expect(next.value == hex(0xb))
        next.succeed()
        #expect(harness.backend.values == [hex(0xa), hex(0xb)])
        #expect(harness.clock.requestedSleeps.isEmpty)
        #expect(
            harness.log.recorded.map(\.message) == [
                "device token upload failed (attempt 1): the upload gave up; waiting for a new value or a re-send"
            ])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func givingUpStopsUntilTheAppAsksForAReSend() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).answer(.giveUp)
        harness.manager.resendToken()  // after a log-in, say
        let again = try #require(await harness.backend.nextCall())
        #expect(again.value == hex(0xa))
        again.succeed()
        #expect(harness.backend.values == [hex(0xa), hex(0xa)])
        #expect(harness.clock.requestedSleeps.isEmpty)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aRequestedRetryDelayIsHonouredUpToItsOwnCap() async throws {
        // Policy: 1 s doubling to 8 s, no jitter; requested delays capped at the default hour,
        // not at the backoff's 8 s.
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).answer(.retry(after: .seconds(3)))
        #expect(await harness.nextSleep() == .seconds(3))
        harness.clock.advance(by: .seconds(3))
        try #require(await harness.backend.nextCall()).answer(.retry(after: .seconds(3600)))
        #expect(await harness.nextSleep() == .seconds(3600))  // an hour is honoured
        harness.clock.advance(by: .seconds(3600))
        try #require(await harness.backend.nextCall()).answer(.retry(after: .seconds(7200)))
        #expect(await harness.nextSleep() == .seconds(3600))  // capped by maximumRequestedDelay
        harness.clock.advance(by: .seconds(3600))
        try #require(await harness.backend.nextCall()).answer(.retry(after: .seconds(-5)))
        #expect(await harness.nextSleep() == .seconds(8))  // negative: the backoff before retry 4
        harness.clock.advance(by: .seconds(8))
        try #require(await harness.backend.nextCall()).answer(.retry())
        #expect(await harness.nextSleep() == .seconds(8))  // the policy's wait before retry 5
        harness.clock.advance(by: .seconds(8))
        let last = try #require(await harness.backend.nextCall())
        #expect(last.value == hex(0xa))
        last.succeed()
        #expect(
            harness.clock.requestedSleeps == [.seconds(3), .seconds(3600), .seconds(3600), .seconds(8), .seconds(8)])
        #expect(
            harness.log.recorded.first?.message
                == "device token upload failed (attempt 1): the upload asked to retry; retrying in 3.0 seconds")
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aReSendUploadsTheUnchangedValueAgain() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).succeed()
        harness.manager.resendToken()
        let again = try #require(await harness.backend.nextCall())
        #expect(
            again.request
                == TokenUpload(
                    token: hex(0xa), serverToken: hex(0xa), environment: .development, registrationError: nil))
        again.succeed()
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aReSendDuringAnUploadIsFollowedByOneMore() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        harness.manager.resendToken()
        harness.manager.resendToken()  // two requests while one upload runs: one more upload
        first.succeed()
        try #require(await harness.backend.nextCall()).succeed()
        harness.manager.didRegister(deviceToken: token(0xb))
        let next = try #require(await harness.backend.nextCall())
        #expect(next.value == hex(0xb))
        next.succeed()
        #expect(harness.backend.values == [hex(0xa), hex(0xa), hex(0xb)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aReSendEndsABackoffWait() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).fail(TestError(description: "down"))
        #expect(await harness.nextSleep() == .seconds(1))
        harness.manager.resendToken()  // no clock movement
        let again = try #require(await harness.backend.nextCall())
        #expect(again.value == hex(0xa))
        again.succeed()
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aReSendBeforeTheFirstTokenUploadsNothing() async throws {
        let harness = Harness()
        await waitUntil(#"harness.manager.uploaderMailboxes.count == 1"#) {
            harness.manager.uploaderMailboxes.count == 1
        }
        harness.manager.resendToken()
        harness.manager.didRegister(deviceToken: token(0xa))
        let first = try #require(await harness.backend.nextCall())
        #expect(first.value == hex(0xa))  // the first call: the launch's nil was not uploaded
        first.succeed()
        #expect(harness.backend.values == [hex(0xa)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aPeriodicReSendUploadsTheValueAgainAfterTheInterval() async throws {
        let policy = try RetryPolicy(
            initialDelay: .seconds(1), maximumDelay: .seconds(8), jitter: 0, resendInterval: .seconds(86_400))
        let harness = Harness(policy: policy)
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).succeed()
        #expect(await harness.nextSleep() == .seconds(86_400))
        harness.clock.advance(by: .seconds(86_400))
        let again = try #require(await harness.backend.nextCall())
        #expect(again.value == hex(0xa))
        again.succeed()
        #expect(await harness.nextSleep() == .seconds(86_400))  // and again a day later
        // A change during the wait goes at once.
        harness.manager.didRegister(deviceToken: token(0xb))
        let changed = try #require(await harness.backend.nextCall())
        #expect(changed.value == hex(0xb))
        changed.succeed()
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func theHTTPStatusMapping() {
        // 2xx: done.
        for status in [200, 201, 204, 299] {
            #expect(UploadOutcome(httpStatusCode: status, retryAfter: "5") == .done)
        }
        // 408, 429, 5xx: retry, after Retry-After when it is delay-seconds.
        #expect(UploadOutcome(httpStatusCode: 503, retryAfter: "120") == .retry(after: .seconds(120)))
        #expect(UploadOutcome(httpStatusCode: 429, retryAfter: " 7 ") == .retry(after: .seconds(7)))
        #expect(UploadOutcome(httpStatusCode: 408, retryAfter: nil) == .retry(after: nil))
        #expect(UploadOutcome(httpStatusCode: 500, retryAfter: "0") == .retry(after: .zero))
        #expect(
            UploadOutcome(httpStatusCode: 599, retryAfter: "99999999999999999999") == .retry(after: .seconds(86_400)))
        // An HTTP-date, or anything not delay-seconds: the policy's backoff.
        #expect(
            UploadOutcome(httpStatusCode: 503, retryAfter: "Fri, 31 Dec 1999 23:59:59 GMT") == .retry(after: nil))
        for field in ["", "-1", "1.5", "+3", "1 2", "٣"] {
            #expect(UploadOutcome(httpStatusCode: 503, retryAfter: field) == .retry(after: nil), "\(field)")
        }
        // Any other 4xx: give up.
        for status in [400, 401, 403, 404, 410, 413, 499] {
            #expect(UploadOutcome(httpStatusCode: status, retryAfter: "1") == .giveUp)
        }
        // Anything else: the policy's backoff.
        for status in [0, 100, 304, 399, 600, -1] {
            #expect(UploadOutcome(httpStatusCode: status, retryAfter: "1") == .retry(after: nil))
        }
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
