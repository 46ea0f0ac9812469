import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// A seeded random source (SplitMix64), so that a test's jitter is reproducible.
struct SeededRandom: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        state &+= 0x9e37_79b9_7f4a_7c15
        var z = state
        z = (z ^ (z >> 30)) &* 0xbf58_476d_1ce4_e5b9
        z = (z ^ (z >> 27)) &* 0x94d0_49bb_1331_11eb
        return z ^ (z >> 31)
    }
}

/// What an app team needs before shipping (issue 46): no retry storm on `Retry-After: 0`, the
/// record bound to the device, the authorization state, the daily re-send, the log's names.
@Suite("Shipping the library", hangGuard())
struct ShippingTests {
    typealias Harness = TokenUploadTests.Harness

    // MARK: Point 1: a requested delay is never shorter than the backoff.

    /// A server that answers `503` with `Retry-After: 0` (or a date in the past, or an upload
    /// answering `.retry(after: .zero)`) forever sees attempts spaced by at least the backoff of
    /// each attempt: the waits are exactly the policy's backoff waits for the same seed.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test(arguments: ["0", "Sun, 06 Nov 1994 08:49:37 GMT", "zero"])
    func aZeroRetryAfterWaitsTheBackoffOfEachAttempt(answer: String) async throws {
        let policy = RetryPolicy.standard
        let seed = SeededRandom(state: 0x46)
        var draws = Array(repeating: UInt64(0), count: 12)
        var generator = seed
        for index in draws.indices { draws[index] = generator.next() }
        let harness = Harness(policy: policy, random: draws)
        harness.manager.didRegister(deviceToken: token(0xa))
        var replica = ScriptedRandom(values: draws)
        for attempt in 1...10 {
            let call = try #require(await harness.backend.nextCall())
            #expect(call.value == hex(0xa))
            call.answer(
                answer == "zero" ? .retry(after: .zero) : UploadOutcome(httpStatusCode: 503, retryAfter: answer))
            let wait = try #require(await harness.nextSleep())
            let backoff = policy.delay(forRetry: attempt, using: &replica)
            #expect(wait == backoff, "attempt \(attempt)")
            // At least the least the backoff of this attempt can be: base(n) × (1 − jitter).
            let base = min(Duration.seconds(1) * (1 << min(attempt - 1, 20)), .seconds(300))
            #expect(wait >= base / 2, "attempt \(attempt)")
            #expect(wait > .zero)
            harness.clock.advance(by: wait)
        }
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aRequestedDelayLongerThanTheBackoffIsKept() throws {
        let policy = try RetryPolicy(initialDelay: .seconds(1), maximumDelay: .seconds(300), jitter: 0.5)
        var zero = ScriptedRandom(values: [0])
        #expect(policy.delay(forRetry: 1, requested: .seconds(120), using: &zero) == .seconds(120))
        #expect(policy.delay(forRetry: 1, requested: .zero, using: &zero) == .seconds(1))
        #expect(policy.delay(forRetry: 9, requested: .seconds(2), using: &zero) == .seconds(256))
        #expect(policy.delay(forRetry: 3, requested: nil, using: &zero) == .seconds(4))
    }

    // MARK: Point 3: the record is bound to the device that wrote it.

    /// A `ServerRecordStore` over `DeviceBoundRecords`, with its bytes in memory (as
    /// `UserDefaults` keeps them) and its marker in a folder standing for one device's
    /// backup-excluded files.
    struct DeviceStore: ServerRecordStore {
        let bytes: Locked<Data?>
        let records: DeviceBoundRecords

        init(bytes: Data?, device: URL) {
            let slot = Locked(bytes)
            self.bytes = slot
            records = DeviceBoundRecords(
                marker: FileDeviceMarker(url: device.appendingPathComponent("record.device-marker")),
                read: { slot.withLock { $0 } }, write: { data in slot.withLock { $0 = data } })
        }

        func load() -> ServerRecord? { records.load() }
        func save(_ record: ServerRecord) { records.save(record) }
        /// The bytes a backup carries.
        var backup: Data? { bytes.withLock { $0 } }
    }

    static func temporaryFolder() throws -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("forge-push-token-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        return url
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aRecordRestoredOntoAnotherDeviceIsReadAsNone() async throws {
        let oldPhone = try Self.temporaryFolder()
        let newPhone = try Self.temporaryFolder()
        defer {
            try? FileManager.default.removeItem(at: oldPhone)
            try? FileManager.default.removeItem(at: newPhone)
        }
        let old = DeviceStore(bytes: nil, device: oldPhone)
        let first = Harness(record: old)
        first.manager.didRegister(deviceToken: token(0xa))
        try #require(await first.backend.nextCall()).succeed()
        await waitUntil(#"old.load()?.token == hex(0xa)"#) { old.load()?.token == hex(0xa) }
        await first.stop()

        // The same device, relaunched: the record is read, and names the token it replaces.
        let relaunched = Harness(record: DeviceStore(bytes: old.backup, device: oldPhone))
        relaunched.manager.didRegister(deviceToken: token(0xb))
        let replacing = try #require(await relaunched.backend.nextCall())
        #expect(replacing.request.serverToken == hex(0xa))
        await relaunched.stop()

        // The backup restored onto another phone: its bytes, not its marker.
        let restored = DeviceStore(bytes: old.backup, device: newPhone)
        #expect(restored.backup != nil)
        #expect(restored.load() == nil)
        let onNewPhone = Harness(record: restored)
        onNewPhone.manager.didRegister(deviceToken: token(0xc))
        let call = try #require(await onNewPhone.backend.nextCall())
        #expect(call.request.token == hex(0xc))
        #expect(call.request.serverToken == nil)  // never the old phone's token
        call.succeed()
        await waitUntil(#"restored.load()?.token == hex(0xc)"#) { restored.load()?.token == hex(0xc) }
        await onNewPhone.stop()
    }

    @Test func aRecordWithoutAMarkerOrWithAnotherDevicesIsNone() throws {
        let phone = try Self.temporaryFolder()
        let other = try Self.temporaryFolder()
        defer {
            try? FileManager.default.removeItem(at: phone)
            try? FileManager.default.removeItem(at: other)
        }
        let record = ServerRecord(token: hex(0xa), environment: .production, acknowledged: nil, uploadsPaused: true)
        let store = DeviceStore(bytes: nil, device: phone)
        store.save(record)
        #expect(store.load() == record)
        let marker = FileDeviceMarker(url: phone.appendingPathComponent("record.device-marker"))
        #expect(marker.read()?.isEmpty == false)
        // Another device's marker, made first: the restored record is not its own.
        let elsewhere = DeviceStore(bytes: store.backup, device: other)
        #expect(elsewhere.records.marker.create() != nil)
        #expect(elsewhere.load() == nil)
        // A record written before the binding (0.1.0's bare JSON) is none too.
        let bare = DeviceStore(bytes: try JSONEncoder().encode(record), device: phone)
        #expect(bare.load() == nil)
    }

    // MARK: Point 4: the authorization state.

    @Test func authorizationStatusesByTheirSystemValues() {
        #expect(NotificationAuthorization(authorizationStatusRawValue: 0) == .notDetermined)
        #expect(NotificationAuthorization(authorizationStatusRawValue: 1) == .denied)
        #expect(NotificationAuthorization(authorizationStatusRawValue: 2) == .authorized)
        #expect(NotificationAuthorization(authorizationStatusRawValue: 3) == .provisional)
        #expect(NotificationAuthorization(authorizationStatusRawValue: 4) == .ephemeral)
        #expect(NotificationAuthorization(authorizationStatusRawValue: 5) == nil)
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aChangedAuthorizationInTheForegroundUploadsAgainButIsNoStreamChange() async throws {
        let authorization = FakeAuthorization(.authorized)
        let harness = Harness(authorization: authorization)
        var stream = harness.manager.tokenStream.makeAsyncIterator()
        #expect(await stream.next() == .some(nil))
        harness.manager.didRegister(deviceToken: token(0xa))
        #expect(await stream.next() == .some(hex(0xa)))
        let first = try #require(await harness.backend.nextCall())
        #expect(first.request.authorization == .authorized)
        first.succeed()
        await waitUntil(#"harness.record.load()?.authorization == .authorized"#) {
            harness.record.load()?.authorization == .authorized
        }

        // Back in the foreground, unchanged: nothing goes.
        harness.manager.applicationWillEnterForeground()
        await waitUntil(#"authorization.reads == 2 && harness.manager.uploaderMailboxes.first?.hasNews == false"#) {
            authorization.reads == 2 && harness.manager.uploaderMailboxes.first?.hasNews == false
        }
        // The user turned alerts off in Settings, then returned to the app.
        authorization.set(.denied)
        harness.manager.applicationWillEnterForeground()
        let again = try #require(await harness.backend.nextCall())
        #expect(
            again.request
                == TokenUpload(
                    token: hex(0xa), serverToken: hex(0xa), environment: .development, registrationError: nil,
                    authorization: .denied))
        again.succeed()
        await waitUntil(#"harness.record.load()?.authorization == .denied"#) {
            harness.record.load()?.authorization == .denied
        }
        // The stream's next element is the next token, not the re-upload.
        try await harness.expectNothingMoreThen(0xb)
        #expect(await stream.next() == .some(hex(0xb)))
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aRelaunchWithAnotherAuthorizationUploadsTheSameTokenAgain() async throws {
        let record = MemoryServerRecordStore(
            ServerRecord(
                token: hex(0xa), environment: .development, acknowledged: WallClock().now(), uploadsPaused: false,
                authorization: .authorized))
        let harness = Harness(register: 0xa, record: record, authorization: FakeAuthorization(.provisional))
        let call = try #require(await harness.backend.nextCall())
        #expect(call.request.token == hex(0xa))
        #expect(call.request.serverToken == hex(0xa))
        #expect(call.request.authorization == .provisional)
        call.succeed()
        await harness.stop()

        // The same status after a relaunch: nothing goes.
        let same = Harness(register: 0xa, record: record, authorization: FakeAuthorization(.provisional))
        await same.waitUntilTakenAll(hex(0xa))
        try await same.expectNothingMoreThen(0xb)
        await same.stop()
    }

    // MARK: Point 5: the daily re-send, checked at launch and in the foreground.

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func theStandardPolicyResendsAnUnchangedTokenAfterADayOnReturningToTheForeground() async throws {
        let wall = WallClock()
        let harness = Harness(policy: .standard, wallClock: wall)
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).succeed()
        await waitUntil(#"harness.record.load()?.token == hex(0xa)"#) { harness.record.load()?.token == hex(0xa) }

        // Suspended for most of a day (the manual clock does not move): nothing.
        wall.advance(by: 86_000)
        harness.manager.applicationWillEnterForeground()
        await waitUntil(#"harness.manager.uploaderMailboxes.first?.hasNews == false"#) {
            harness.manager.uploaderMailboxes.first?.hasNews == false
        }
        #expect(harness.backend.values == [hex(0xa)])
        // A day after the acknowledgement: the same token again.
        wall.advance(by: 400)
        harness.manager.applicationWillEnterForeground()
        let again = try #require(await harness.backend.nextCall())
        #expect(again.request.token == hex(0xa))
        #expect(again.request.serverToken == hex(0xa))
        again.succeed()
        await harness.stop()
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func theStandardPolicyResendsAtLaunchADayAfterTheAcknowledgement() async throws {
        let wall = WallClock()
        let record = MemoryServerRecordStore(
            ServerRecord(
                token: hex(0xa), environment: .development, acknowledged: wall.now(), uploadsPaused: false))
        wall.advance(by: 86_401)
        let harness = Harness(policy: .standard, register: 0xa, record: record, wallClock: wall)
        let call = try #require(await harness.backend.nextCall())
        #expect(call.request.token == hex(0xa))
        #expect(call.request.serverToken == hex(0xa))
        call.succeed()
        await harness.stop()
    }

    // MARK: Point 8: the log's names.

    @Test func theLogSubsystemIsReverseDNS() {
        let parts = PushTokenManager.logSubsystem.split(separator: ".", omittingEmptySubsequences: false)
        #expect(parts.count >= 3)
        #expect(parts.allSatisfy { !$0.isEmpty })
        #expect(parts.dropLast().allSatisfy { $0 == $0.lowercased() })
    }

    /// The error summaries that the library's doc comments show have the form the log writes.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func docCommentsShowTheLoggedErrorFormat() async throws {
        let summary = LoggedError.summary(URLError(.notConnectedToInternet))
        #expect(summary == "NSURLErrorDomain error -1009")
        let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Sources/ForgePushToken")
        var shown: [String] = []
        for name in try FileManager.default.contentsOfDirectory(atPath: sources.path) where name.hasSuffix(".swift") {
            let text = try String(contentsOf: sources.appendingPathComponent(name), encoding: .utf8)
            let docs = text.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
                .filter { $0.hasPrefix("///") }.map { $0.dropFirst(3) }.joined(separator: " ")
            #expect(!docs.contains("type, domain and code"), "\(name) says the error is named by its type")
            for piece in docs.split(separator: "`") where piece.contains("NSURLErrorDomain") {
                shown.append(String(piece))
            }
        }
        #expect(!shown.isEmpty)
        for piece in shown {
            #expect(piece.wholeMatch(of: /NSURLErrorDomain error -?[0-9]+/) != nil, "\(piece)")
        }

        // And the message itself.
        let harness = Harness()
        harness.manager.didRegister(deviceToken: token(0xa))
        try #require(await harness.backend.nextCall()).fail(URLError(.notConnectedToInternet))
        _ = await harness.nextSleep()
        #expect(
            harness.log.recorded.map(\.message).last
                == "device token upload failed (attempt 1): NSURLErrorDomain error -1009; retrying in 1.0 seconds")
        await harness.stop()
    }
}
