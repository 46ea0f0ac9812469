import ForgePushToken
import ForgePushTokenTestSupport
import Foundation
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

// The upload examples of docs/library.md and of the DocC article "Keeping your server in step",
// compiled and tested here. The code between each pair of marker lines must appear in both
// character for character; the test `documentationShowsThisCode` checks it. `forgePushTokenServerUpload(baseURL:)` is also the
// upload function of the end-to-end test (ServerUploadEndToEndTests.swift).

// BEGIN upload on change
/// Your backend's device-token endpoints.
protocol DeviceTokenAPI: Sendable {
    func putDeviceToken(_ token: String, environment: APNsEnvironment) async throws
    func deleteDeviceToken(_ token: String) async throws
}

/// Keeps the backend in step with the device token until the returned task is cancelled:
/// uploads each new token with its APNs environment, deletes the token the server holds when
/// the app loses its token or the user signs out, retries failures (a thrown error is retried
/// with backoff). The defaults keep what the server holds in `UserDefaults` and wait in real
/// time; tests pass a `MemoryServerRecordStore` and a manual clock.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
func startUploadingDeviceToken(
    from pushTokens: PushTokenManager,
    to api: some DeviceTokenAPI,
    serverRecord: any ServerRecordStore = PushTokenManager.defaultServerRecordStore(),
    clock: some Clock<Duration> = ContinuousClock()
) -> Task<Void, Never> {
    Task {
        await pushTokens.uploadTokenChanges(serverRecord: serverRecord, clock: clock) { upload in
            if let token = upload.token {
                try await api.putDeviceToken(token, environment: upload.environment)
            } else if let old = upload.serverToken {
                try await api.deleteDeviceToken(old)
            }
            return .done
        }
    }
}
// END upload on change

// BEGIN main-actor model
/// An app's API client and model, isolated to the main actor and not `Sendable`: the upload
/// closure runs on the main actor, so it uses them directly.
@MainActor final class APIClient {
    private(set) var devices: [String: APNsEnvironment] = [:]
    private(set) var credentials: String? = "the user's session"

    func forgetCredentials() {
        credentials = nil
    }

    func register(_ token: String, environment: APNsEnvironment) async throws {
        devices[token] = environment  // a real client sends a request here
    }

    func unregister(_ token: String) async throws {
        devices[token] = nil
    }
}

@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
@MainActor final class PushModel {
    let pushTokens: PushTokenManager
    let client: APIClient
    let serverRecord: any ServerRecordStore
    private(set) var lastUpload: PushTokenManager.TokenUpload?

    init(
        pushTokens: PushTokenManager, client: APIClient,
        serverRecord: any ServerRecordStore = PushTokenManager.defaultServerRecordStore()
    ) {
        self.pushTokens = pushTokens
        self.client = client
        self.serverRecord = serverRecord
    }

    /// Keeps the backend in step until the calling task is cancelled.
    func keepServerInStep() async {
        await pushTokens.uploadTokenChanges(serverRecord: serverRecord) { upload in
            lastUpload = upload
            if let token = upload.token {
                try await client.register(token, environment: upload.environment)
            } else if let old = upload.serverToken {
                try await client.unregister(old)
            }
            return .done
        }
    }

    /// After a log-in: the server should hear about this device again.
    func userDidLogIn() {
        pushTokens.resumeUploads()
        pushTokens.resendToken()
    }

    /// After a sign-out: the server should no longer hold this device's token. Awaited, so that
    /// the deletion goes with the user's credentials; they are dropped after it.
    func userDidSignOut() async -> PushTokenManager.SignOutOutcome {
        let outcome = await pushTokens.signOut()
        client.forgetCredentials()
        return outcome
    }
}
// END main-actor model

// BEGIN sign-out order
/// Where the app keeps the user's session (a keychain item, a token in memory).
protocol UserSession: Sendable {
    func dropCredentials() async
}

/// Signs the user out in the order that lets the deletion reach the server: the sign-out goes
/// with the user's credentials, and they are dropped only once it has settled.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
func signOutUser(
    pushTokens: PushTokenManager, session: some UserSession
) async -> PushTokenManager.SignOutOutcome {
    let outcome = await pushTokens.signOut()  // waits until the DELETE has settled
    await session.dropCredentials()  // only then
    return outcome
}
// END sign-out order

// BEGIN manual clock
/// A clock for tests whose time moves only when the test calls `advance(by:)`: a test of the
/// upload policy runs its retries at once, and reads every wait that was asked.
///
/// `@unchecked Sendable` is sound: every stored variable is private and read or written only
/// inside `lock.withLock`.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
final class TestClock: Clock, @unchecked Sendable {
    struct Instant: InstantProtocol {
        var offset: Duration
        func advanced(by duration: Duration) -> Instant { Instant(offset: offset + duration) }
        func duration(to other: Instant) -> Duration { other.offset - offset }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.offset < rhs.offset }
    }

    private struct Sleeper {
        let id: UUID
        let deadline: Instant
        let continuation: CheckedContinuation<Void, any Error>
    }

    private let lock = NSLock()
    private var time = Instant(offset: .zero)
    private var sleepers: [Sleeper] = []
    private var waits: [Duration] = []

    var now: Instant { lock.withLock { time } }
    var minimumResolution: Duration { .zero }
    /// Every wait asked so far, in order.
    var requestedWaits: [Duration] { lock.withLock { waits } }

    func sleep(until deadline: Instant, tolerance: Duration?) async throws {
        let id = UUID()
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let now: Result<Void, any Error>? = lock.withLock {
                    if Task.isCancelled { return .failure(CancellationError()) }
                    waits.append(time.duration(to: deadline))
                    if deadline <= time { return .success(()) }
                    sleepers.append(Sleeper(id: id, deadline: deadline, continuation: continuation))
                    return nil
                }
                if let now { continuation.resume(with: now) }
            }
        } onCancel: {
            let sleeper = lock.withLock { sleepers.firstIndex { $0.id == id }.map { sleepers.remove(at: $0) } }
            sleeper?.continuation.resume(throwing: CancellationError())
        }
    }

    /// Moves the time forward by `duration` and wakes every sleep that is due.
    func advance(by duration: Duration) {
        let due = lock.withLock {
            time = time.advanced(by: duration)
            let due = sleepers.filter { $0.deadline <= time }
            sleepers.removeAll { $0.deadline <= time }
            return due
        }
        for sleeper in due { sleeper.continuation.resume() }
    }
}
// END manual clock

// BEGIN forge-push-token-server upload
/// An upload function for `uploadTokenChanges` that sends the token to a
/// forge-push-token-server: `POST /register` with `{"deviceToken":"<hex>","environment":"…"}`,
/// or `POST /fail` with the registration error when the app has no token (which clears it on the
/// server). The answer decides what happens next: 2xx done; 408, 429 and 5xx retried (after
/// `Retry-After`, capped by the policy); any other 4xx given up. A network error is thrown, and
/// retried with backoff. A sign-out is sent as `POST /fail` too: the server then holds no token.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
func forgePushTokenServerUpload(
    baseURL: URL,
    session: URLSession = .shared
) -> @Sendable (PushTokenManager.TokenUpload) async throws -> PushTokenManager.UploadOutcome {
    { upload in
        var request = URLRequest(url: baseURL.appendingPathComponent(upload.token == nil ? "fail" : "register"))
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = try JSONEncoder().encode(
            upload.token.map { ["deviceToken": $0, "environment": upload.environment.rawValue] }
                ?? ["message": upload.registrationError ?? "the app has no device token"])
        let (_, response) = try await session.data(for: request)
        guard let response = response as? HTTPURLResponse else { throw URLError(.badServerResponse) }
        return PushTokenManager.UploadOutcome(
            httpStatusCode: response.statusCode,
            retryAfter: response.value(forHTTPHeaderField: "Retry-After"))
    }
}
// END forge-push-token-server upload

/// A list guarded by a lock (this file imports only the library's public API, so not `Locked`).
///
/// `@unchecked Sendable` is sound: `values` is private and read or written only inside
/// `lock.withLock`, which gives mutual exclusion and orders each access after the previous one;
/// `lock` itself is a `let` and `NSLock` is thread-safe.
private final class Recorded: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [String] = []

    /// Appends `value` and returns how many values there were before it equal to it.
    @discardableResult
    func append(_ value: String) -> Int {
        lock.withLock {
            defer { values.append(value) }
            return values.count { $0 == value }
        }
    }

    var all: [String] { lock.withLock { values } }
}

/// A backend that records each call and fails the first `put` of chosen tokens.
private final class FakeAPI: DeviceTokenAPI {
    let failFirstPutOf: Set<String>
    let calls = Recorded()
    let received: AsyncStream<String>
    private let receive: AsyncStream<String>.Continuation

    init(failFirstPutOf: Set<String> = []) {
        self.failFirstPutOf = failFirstPutOf
        (received, receive) = AsyncStream.makeStream(of: String.self)
    }

    func putDeviceToken(_ token: String, environment: APNsEnvironment) async throws {
        let call = "put \(token) \(environment.rawValue)"
        if calls.append(call) == 0, failFirstPutOf.contains(token) {
            throw TestError(description: "backend unavailable")
        }
        receive.yield(call)
    }

    func deleteDeviceToken(_ token: String) async throws {
        calls.append("delete \(token)")
        receive.yield("delete \(token)")
    }
}

/// A session that records when its credentials are dropped, in the backend's list of calls.
private struct FakeSession: UserSession {
    let calls: Recorded

    func dropCredentials() async {
        calls.append("drop credentials")
    }
}

@Suite("Documentation examples", hangGuard())
struct DocumentationExampleTests {
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func uploadOnChangePutsEachNewTokenAndDeletesAClearedOne() async {
        let manager = PushTokenManager(logHandler: silent)
        let api = FakeAPI()
        let running = startUploadingDeviceToken(from: manager, to: api, serverRecord: MemoryServerRecordStore())
        var received = api.received.makeAsyncIterator()

        // On Linux there is no provisioning profile: production, as for an App Store build.
        manager.didRegister(deviceToken: token(0xa))
        #expect(await received.next() == "put \(hex(0xa)) production")
        manager.didRegister(deviceToken: token(0xa))  // no change: nothing
        manager.didFailToRegister(error: TestError(description: "x"))  // cleared: delete it
        #expect(await received.next() == "delete \(hex(0xa))")
        manager.didRegister(deviceToken: token(0xb))
        #expect(await received.next() == "put \(hex(0xb)) production")

        running.cancel()
        await running.value
        #expect(
            api.calls.all == ["put \(hex(0xa)) production", "delete \(hex(0xa))", "put \(hex(0xb)) production"])
    }

    /// The `@MainActor` model compiles (the upload closure uses main-actor state without `await`)
    /// and runs on the main actor.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test @MainActor func aMainActorModelKeepsItsServerInStep() async throws {
        let manager = PushTokenManager(logHandler: silent)
        let client = APIClient()
        let model = PushModel(pushTokens: manager, client: client, serverRecord: MemoryServerRecordStore())
        let running = Task { await model.keepServerInStep() }
        manager.didRegister(deviceToken: token(0xa))
        await waitUntil(#"!client.devices.isEmpty"#) { !client.devices.isEmpty }
        #expect(client.devices == [hex(0xa): .production])
        #expect(model.lastUpload?.token == hex(0xa))

        model.userDidLogIn()  // the same token is uploaded again
        await waitUntil("the upload's server token") { model.lastUpload?.serverToken != nil }
        #expect(
            model.lastUpload
                == .init(token: hex(0xa), serverToken: hex(0xa), environment: .production, registrationError: nil))

        let outcome = await model.userDidSignOut()  // the server forgets this device's token
        #expect(outcome == .deleted)
        #expect(client.devices.isEmpty)  // deleted before the credentials were dropped
        #expect(client.credentials == nil)
        #expect(model.lastUpload?.isSignOut == true)
        #expect(model.lastUpload?.serverToken == hex(0xa))
        model.userDidLogIn()  // and hears about it again
        await waitUntil(#"!client.devices.isEmpty"#) { !client.devices.isEmpty }
        #expect(client.devices == [hex(0xa): .production])

        manager.didFailToRegister(error: TestError(description: "revoked"))
        await waitUntil(#"client.devices.isEmpty"#) { client.devices.isEmpty }
        #expect(model.lastUpload?.registrationError == "revoked")
        running.cancel()
        await running.value
    }

    /// The documented sign-out drops the credentials only after the deletion has settled.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func theDocumentedSignOutDropsTheCredentialsAfterTheDeletion() async throws {
        let manager = PushTokenManager(logHandler: silent)
        let api = FakeAPI()
        let running = startUploadingDeviceToken(from: manager, to: api, serverRecord: MemoryServerRecordStore())
        var received = api.received.makeAsyncIterator()
        manager.didRegister(deviceToken: token(0xa))
        #expect(await received.next() == "put \(hex(0xa)) production")
        let session = FakeSession(calls: api.calls)
        #expect(await signOutUser(pushTokens: manager, session: session) == .deleted)
        #expect(api.calls.all == ["put \(hex(0xa)) production", "delete \(hex(0xa))", "drop credentials"])
        running.cancel()
        await running.value
    }

    /// The example uses the standard policy: the retry comes 0.5 to 1 s after the failure, on the
    /// clock it is given; the documentation's manual clock runs it without waiting in real time.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func uploadOnChangeRetriesAFailedUploadOnTheDocumentedManualClock() async throws {
        let manager = PushTokenManager(logHandler: silent)
        let api = FakeAPI(failFirstPutOf: [hex(0xc)])
        let clock = TestClock()
        let running = startUploadingDeviceToken(
            from: manager, to: api, serverRecord: MemoryServerRecordStore(), clock: clock)
        var received = api.received.makeAsyncIterator()
        manager.didRegister(deviceToken: token(0xc))
        await waitUntil(#"!clock.requestedWaits.isEmpty"#) { !clock.requestedWaits.isEmpty }
        let wait = try #require(clock.requestedWaits.first)
        #expect(wait >= .milliseconds(500) && wait <= .seconds(1))
        clock.advance(by: wait - .milliseconds(1))
        #expect(api.calls.all == ["put \(hex(0xc)) production"])  // not before the wait ends
        clock.advance(by: .milliseconds(1))
        #expect(await received.next() == "put \(hex(0xc)) production")
        running.cancel()
        await running.value
        #expect(api.calls.all == ["put \(hex(0xc)) production", "put \(hex(0xc)) production"])
    }

    /// Issue 46 point 8: an app-group suite needs reason 1C8F.1, and both pages say so.
    @Test func theDocumentationNamesTheAppGroupReason() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        for page in ["docs/library.md", "Sources/ForgePushToken/ForgePushToken.docc/KeepingYourServerInStep.md"] {
            let text = try String(contentsOf: root.appendingPathComponent(page), encoding: .utf8)
            #expect(text.contains("`1C8F.1`"), "\(page) does not name reason 1C8F.1 for an app-group suite")
        }
    }

    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func documentationShowsThisCode() throws {
        let here = URL(fileURLWithPath: #filePath)
        let root = here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let source = try String(contentsOf: here, encoding: .utf8)
        let pages = ["docs/library.md", "Sources/ForgePushToken/ForgePushToken.docc/KeepingYourServerInStep.md"]
        let texts = try pages.map { try String(contentsOf: root.appendingPathComponent($0), encoding: .utf8) }
        for name in [
            "upload on change", "main-actor model", "forge-push-token-server upload", "sign-out order", "manual clock",
        ] {
            let begin = "// BEGIN \(name)\n"
            let end = "// END \(name)\n"
            let example = try #require(
                source.range(of: begin).flatMap { start in
                    source.range(of: end, range: start.upperBound..<source.endIndex).map {
                        source[start.upperBound..<$0.lowerBound]
                    }
                })
            #expect(example.count > 200)
            for (page, text) in zip(pages, texts) {
                #expect(text.contains(example), "\(page) does not show the example \(name)")
            }
        }
    }
}
