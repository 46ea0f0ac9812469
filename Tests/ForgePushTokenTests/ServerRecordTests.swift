import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// What the server holds, kept across launches (`ServerRecordStore`), sign-out, and `Retry-After`:
/// on a manual clock, a set wall clock and a scripted backend. A "relaunch" is a new manager and a
/// new upload call over the same store.
@Suite("Server record, sign-out and Retry-After", hangGuard())
struct ServerRecordTests {
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    typealias Harness = TokenUploadTests.Harness

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aRecordRoundTripsThroughJSONAndGarbageIsNoRecord() throws {
        let record = ServerRecord(
            token: hex(0xa), environment: .production, acknowledged: Date(timeIntervalSince1970: 1_000),
            uploadsPaused: true)
        let data = try JSONEncoder().encode(record)
        #expect(try JSONDecoder().decode(ServerRecord.self, from: data) == record)
        let empty = ServerRecord(token: nil, environment: .development, acknowledged: nil, uploadsPaused: false)
        let emptyJSON = try JSONEncoder().encode(empty)
        #expect(String(decoding: emptyJSON, as: UTF8.self).contains("token") == false)
        #expect(try JSONDecoder().decode(ServerRecord.self, from: emptyJSON) == empty)
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode(
                ServerRecord.self, from: Data(#"{"environment":"staging","uploadsPaused":false}"#.utf8))
        }
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func anAcknowledgedUploadIsRecordedWithItsWallClockTime() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).succeed()
        try await harness.expectNothingMoreThen(0xb)
        await waitUntil(#"harness.record.load()?.token == hex(0xb)"#) { harness.record.load()?.token == hex(0xb) }
        #expect(
            harness.record.load()
                == ServerRecord(
                    token: hex(0xb), environment: .development, acknowledged: harness.wallClock.now(),
                    uploadsPaused: false))
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func afterARelaunchWithANewTokenTheServerIsToldWhichOneItReplaces() async throws {
        let record = MemoryServerRecordStore()
        let first = Harness(record: record)
        first.manager.didRegister(deviceToken: token(0xa))
        try #require(await first.backend.nextCall()).succeed()
        await first.stop()

        let relaunched = Harness(register: 0xb, record: record)
        let call = try #require(await relaunched.backend.nextCall())
        #expect(
            call.request
                == TokenUpload(
                    token: hex(0xb), serverToken: hex(0xa), environment: .development, registrationError: nil))
        call.succeed()
        await waitUntil(#"record.load()?.token == hex(0xb)"#) { record.load()?.token == hex(0xb) }
        #expect(record.load()?.acknowledged == relaunched.wallClock.now())
        await relaunched.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func anUnchangedTokenAfterARelaunchIsNotUploadedAgain() async throws {
        let record = MemoryServerRecordStore(
            ServerRecord(
                token: hex(0xa), environment: .development, acknowledged: WallClock().now(), uploadsPaused: false))
        let relaunched = Harness(register: 0xa, record: record)
        await relaunched.waitUntilTakenAll(hex(0xa))
        // The next upload is the next value's: 0xa was not uploaded again.
        try await relaunched.expectNothingMoreThen(0xb)
        #expect(relaunched.backend.values == [hex(0xb)])
        #expect(relaunched.backend.requests.first?.serverToken == hex(0xa))
        await relaunched.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func theResendIntervalCountsFromThePersistedAcknowledgement() async throws {
        // Acknowledged 23 hours before the relaunch; a daily re-send is due an hour after it.
        let wall = WallClock()
        let record = MemoryServerRecordStore(
            ServerRecord(token: hex(0xa), environment: .development, acknowledged: wall.now(), uploadsPaused: false))
        wall.advance(by: 23 * 3600)
        let policy = try RetryPolicy(
            initialDelay: .seconds(1), maximumDelay: .seconds(8), jitter: 0, resendInterval: .seconds(86_400))
        let relaunched = Harness(policy: policy, register: 0xa, record: record, wallClock: wall)
        #expect(await relaunched.nextSleep() == .seconds(3600))
        #expect(relaunched.backend.values.isEmpty)
        relaunched.clock.advance(by: .seconds(3600))
        let again = try #require(await relaunched.backend.nextCall())
        #expect(again.request.token == hex(0xa))
        again.succeed()
        #expect(await relaunched.nextSleep() == .seconds(86_400))  // then daily from now
        await relaunched.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aRecordOfAnotherEnvironmentOnlyNamesTheReplacedToken() async throws {
        let record = MemoryServerRecordStore(
            ServerRecord(
                token: hex(0xa), environment: .production, acknowledged: WallClock().now(), uploadsPaused: false))
        let relaunched = Harness(register: 0xa, record: record)  // a development build now
        let call = try #require(await relaunched.backend.nextCall())
        #expect(call.request.token == hex(0xa))
        #expect(call.request.serverToken == hex(0xa))
        call.succeed()
        await waitUntil(#"record.load()?.environment == .development"#) { record.load()?.environment == .development }
        #expect(record.load()?.token == hex(0xa))
        await relaunched.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func signOutSendsOneSignOutThenNothingUntilUploadsResume() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).succeed()
        signOutNow(harness.manager)
        let signOut = try #require(await harness.backend.nextCall())
        #expect(
            signOut.request
                == TokenUpload(
                    token: nil, serverToken: hex(0xa), environment: .development, registrationError: nil,
                    isSignOut: true))
        signOut.succeed()
        await waitUntil(#"harness.record.load()?.token == nil"#) { harness.record.load()?.token == nil }
        #expect(harness.record.load()?.uploadsPaused == true)

        // Signed out: a new token and a re-send are remembered, not sent.
        harness.manager.didRegister(deviceToken: token(0xb))
        harness.manager.resendToken()
        await waitUntil("the uploader to take B from its mailbox") {
            guard let mailbox = harness.manager.uploaderMailboxes.first else { return false }
            return mailbox.lastPut == .some(hex(0xb)) && !mailbox.hasNews
        }
        #expect(harness.backend.values == [hex(0xa), nil])

        harness.manager.resumeUploads()
        let resumed = try #require(await harness.backend.nextCall())
        #expect(
            resumed.request
                == TokenUpload(token: hex(0xb), serverToken: nil, environment: .development, registrationError: nil))
        resumed.succeed()
        await waitUntil(#"harness.record.load()?.token == hex(0xb)"#) { harness.record.load()?.token == hex(0xb) }
        #expect(harness.record.load()?.uploadsPaused == false)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func signOutDuringAnUploadInFlightIsSentAfterIt() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let inFlight = try #require(await harness.backend.nextCall())
        signOutNow(harness.manager)
        await waitUntil(#"harness.manager.uploaderMailboxes.first?.hasNews == true"#) {
            harness.manager.uploaderMailboxes.first?.hasNews == true
        }
        #expect(harness.backend.waitingCount == 0)  // nothing overlaps the upload in flight
        inFlight.succeed()
        let signOut = try #require(await harness.backend.nextCall())
        #expect(signOut.request.isSignOut)
        #expect(signOut.request.serverToken == hex(0xa))  // names what the finished upload put there
        signOut.succeed()
        #expect(harness.backend.maximumInFlight == 1)
        await waitUntil(#"harness.record.load()?.token == nil"#) { harness.record.load()?.token == nil }
        #expect(harness.record.load()?.uploadsPaused == true)
        try await harness.resumeThenExpect(0xa)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func signOutDuringAFailingUploadIsRetriedWithThePolicy() async throws {
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        let inFlight = try #require(await harness.backend.nextCall())
        signOutNow(harness.manager)
        await waitUntil(#"harness.manager.uploaderMailboxes.first?.hasNews == true"#) {
            harness.manager.uploaderMailboxes.first?.hasNews == true
        }
        inFlight.fail(TestError(description: "down"))  // the upload may or may not have landed
        let signOut = try #require(await harness.backend.nextCall())
        #expect(signOut.request.isSignOut)
        #expect(signOut.request.serverToken == nil)  // nothing acknowledged, but one may have landed
        signOut.answer(.retry(after: .seconds(30)))
        #expect(await harness.nextSleep() == .seconds(30))
        harness.clock.advance(by: .seconds(30))
        let again = try #require(await harness.backend.nextCall())
        #expect(again.request.isSignOut)
        again.succeed()
        #expect(
            harness.log.recorded.map(\.message).last
                == "device token sign-out failed (attempt 1): the upload asked to retry; retrying in 30.0 seconds")
        try await harness.resumeThenExpect(0xa)
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aSignOutOutlastsARelaunchAndAnOwedOneIsSent() async throws {
        let record = MemoryServerRecordStore()
        let first = Harness(record: record)
        first.manager.didRegister(deviceToken: token(0xa))
        try #require(await first.backend.nextCall()).succeed()
        signOutNow(first.manager)
        let owed = try #require(await first.backend.nextCall())
        #expect(owed.request.isSignOut)
        await first.stop()  // quit before the sign-out was acknowledged
        #expect(record.load()?.uploadsPaused == true)
        #expect(record.load()?.token == hex(0xa))

        let relaunched = Harness(register: 0xa, record: record)
        let signOut = try #require(await relaunched.backend.nextCall())
        #expect(signOut.request.isSignOut)
        #expect(signOut.request.serverToken == hex(0xa))
        signOut.succeed()
        try await relaunched.resumeThenExpect(0xa)
        await relaunched.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aCallThatStartsAfterSignOutStartsPaused() async throws {
        let manager = PushTokenManager(logHandler: silent)
        manager.didRegister(deviceToken: token(0xa))
        signOutNow(manager)
        let harness = Harness(manager: manager)
        await harness.waitUntilTakenAll(hex(0xa))
        // The server is known to hold nothing, so no sign-out is owed, and nothing is uploaded.
        try await harness.resumeThenExpect(0xa)
        #expect(harness.backend.values == [hex(0xa)])
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func requestedDelaysAreJitteredUpwardAndCappedFirst() throws {
        let policy = try RetryPolicy(
            initialDelay: .seconds(1), maximumDelay: .seconds(8), jitter: 0.5, maximumRequestedDelay: .seconds(600))
        var random = ScriptedRandom(values: [0, 1 << 63, .max])
        #expect(policy.delay(forRetry: 1, requested: .seconds(120), using: &random) == .seconds(120))
        #expect(policy.delay(forRetry: 1, requested: .seconds(120), using: &random) == .seconds(150))
        let most = policy.delay(forRetry: 1, requested: .seconds(120), using: &random)
        #expect(most > .milliseconds(179_999) && most < .seconds(180))
        var zero = ScriptedRandom(values: [0])
        #expect(policy.delay(forRetry: 1, requested: .seconds(7200), using: &zero) == .seconds(600))
        // A negative request is none: the backoff.
        #expect(policy.delay(forRetry: 1, requested: .seconds(-1), using: &zero) == .seconds(1))
        #expect(RetryPolicy.standard.maximumRequestedDelay == .seconds(3600))
        #expect(throws: RetryPolicy.InvalidValue.self) {
            try RetryPolicy(
                initialDelay: .seconds(1), maximumDelay: .seconds(1), jitter: 0, maximumRequestedDelay: .zero)
        }
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func devicesToldTheSameRetryAfterSpreadOut() async throws {
        // Two devices, two seeds: the same Retry-After: 120 becomes two different waits, both at
        // least 120 s.
        let policy = try RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(8), jitter: 0.5)
        var waits: [Duration] = []
        for seed: UInt64 in [0x1234_5678_9abc_def0, 0x0fed_cba9_8765_4321] {
            let harness = Harness(policy: policy, random: [seed])
            harness.manager.didRegister(deviceToken: token(0xa))
            try #require(await harness.backend.nextCall())
                .answer(UploadOutcome(httpStatusCode: 503, retryAfter: "120"))
            waits.append(try #require(await harness.nextSleep()))
            await harness.stop()
        }
        #expect(waits[0] != waits[1])
        #expect(waits.allSatisfy { $0 >= .seconds(120) && $0 < .seconds(180) })
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func retryAfterAsAnHTTPDateInEachOfItsThreeForms() {
        let now = Date(timeIntervalSince1970: 784_111_777)  // Sun, 06 Nov 1994 08:49:37 GMT
        for field in [
            "Sun, 06 Nov 1994 08:51:37 GMT",  // IMF-fixdate
            "Sunday, 06-Nov-94 08:51:37 GMT",  // RFC 850
            "Sun Nov  6 08:51:37 1994",  // asctime
            "  Sun, 06 Nov 1994 08:51:37 GMT ",
        ] {
            #expect(
                UploadOutcome(httpStatusCode: 503, retryAfter: field, now: now) == .retry(after: .seconds(120)),
                "\(field)")
        }
        // A date in the past or now, a malformed or impossible date: the policy's backoff.
        for field in [
            "Sun, 06 Nov 1994 08:49:37 GMT", "Sat, 05 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:51:37 UTC",
            "Sun, 31 Feb 1995 08:51:37 GMT", "Sun, 06 Nov 1994 25:00:00 GMT", "Sun, 06 Foo 1994 08:51:37 GMT",
            "Funday, 06-Nov-94 08:51:37 GMT", "Sun, 6 Nov 1994 08:51:37 GMT", "tomorrow",
        ] {
            #expect(UploadOutcome(httpStatusCode: 503, retryAfter: field, now: now) == .retry(after: nil), "\(field)")
        }
        // More than a day away reads as a day.
        #expect(
            UploadOutcome(httpStatusCode: 429, retryAfter: "Sun, 13 Nov 1994 08:49:37 GMT", now: now)
                == .retry(after: .seconds(86_400)))
    }
}

@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
extension TokenUploadTests.Harness {
    /// Waits until the stream has delivered `value` to the uploader's mailbox and the uploader has
    /// taken everything the mailbox held.
    func waitUntilTakenAll(_ value: String?, sourceLocation: SourceLocation = #_sourceLocation) async {
        await waitUntil(
            "the mailbox to have been put \(String(describing: value)) and the uploader to have taken it",
            sourceLocation: sourceLocation
        ) {
            guard let mailbox = manager.uploaderMailboxes.first else { return false }
            return mailbox.lastPut == .some(value) && !mailbox.hasNews
        }
    }

    /// Resumes uploads and expects the next upload to be `value`'s, answered done.
    func resumeThenExpect(_ value: UInt32, sourceLocation: SourceLocation = #_sourceLocation) async throws {
        manager.resumeUploads()
        let call = try #require(await backend.nextCall(), sourceLocation: sourceLocation)
        #expect(call.request.token == hex(value), sourceLocation: sourceLocation)
        #expect(!call.request.isSignOut, sourceLocation: sourceLocation)
        call.succeed()
    }
}
