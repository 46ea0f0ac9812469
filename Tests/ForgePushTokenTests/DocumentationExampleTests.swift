import ForgePushToken
import Foundation
import Testing

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

// The upload examples of docs/library.md, compiled and tested here. The code between each pair of
// marker lines must appear in docs/library.md character for character; the test
// `documentationShowsThisCode` checks it. `forgePushTokenServerUpload(baseURL:)` is also the
// upload function of the end-to-end test (ServerUploadEndToEndTests.swift).

// BEGIN upload on change
/// Your backend's device-token endpoints.
protocol DeviceTokenAPI: Sendable {
    func putDeviceToken(_ token: String) async throws
    func deleteDeviceToken() async throws
}

/// Keeps the backend in step with the device token until the returned task is cancelled:
/// uploads each new token, clears it when the app loses its token, retries failures.
func startUploadingDeviceToken(
    from pushTokens: PushTokenManager,
    to api: some DeviceTokenAPI
) -> Task<Void, Never> {
    Task {
        await pushTokens.uploadTokenChanges { token in
            if let token {
                try await api.putDeviceToken(token)
            } else {
                try await api.deleteDeviceToken()
            }
        }
    }
}
// END upload on change

// BEGIN forge-push-token-server upload
/// An upload function for `uploadTokenChanges` that sends the token to a
/// forge-push-token-server: `POST /register` with `{"deviceToken":"<hex>"}`, or `POST /fail`
/// when the app has no token (which clears it on the server). Throws unless the server answers
/// 2xx.
func forgePushTokenServerUpload(
    baseURL: URL,
    session: URLSession = .shared
) -> @Sendable (String?) async throws -> Void {
    { token in
        var request = URLRequest(url: baseURL.appendingPathComponent(token == nil ? "fail" : "register"))
        request.httpMethod = "POST"
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.httpBody = try JSONEncoder().encode(
            token.map { ["deviceToken": $0] } ?? ["message": "the app has no device token"])
        let (_, response) = try await session.data(for: request)
        guard let status = (response as? HTTPURLResponse)?.statusCode, (200..<300).contains(status) else {
            throw URLError(.badServerResponse)
        }
    }
}
// END forge-push-token-server upload

/// A list guarded by a lock (this file imports only the library's public API).
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

    func putDeviceToken(_ token: String) async throws {
        let call = "put \(token)"
        if calls.append(call) == 0, failFirstPutOf.contains(token) {
            throw TestError(description: "backend unavailable")
        }
        receive.yield(call)
    }

    func deleteDeviceToken() async throws {
        calls.append("delete")
        receive.yield("delete")
    }
}

@Suite("Documentation examples", .timeLimit(.minutes(1)))
struct DocumentationExampleTests {
    @Test func uploadOnChangePutsEachNewTokenAndDeletesAClearedOne() async {
        let manager = PushTokenManager(logHandler: silent)
        let api = FakeAPI()
        let running = startUploadingDeviceToken(from: manager, to: api)
        var received = api.received.makeAsyncIterator()

        manager.didRegister(deviceToken: token(0xa))
        #expect(await received.next() == "put \(hex(0xa))")
        manager.didRegister(deviceToken: token(0xa))  // no change: nothing
        manager.didFailToRegister(error: TestError(description: "x"))  // cleared: delete
        #expect(await received.next() == "delete")
        manager.didRegister(deviceToken: token(0xb))
        #expect(await received.next() == "put \(hex(0xb))")

        running.cancel()
        await running.value
        #expect(api.calls.all == ["put \(hex(0xa))", "delete", "put \(hex(0xb))"])
    }

    @Test func uploadOnChangeRetriesAFailedUpload() async {
        // The example uses the standard policy: the retry comes after 0.5 to 1 s of real time.
        let manager = PushTokenManager(logHandler: silent)
        let api = FakeAPI(failFirstPutOf: [hex(0xc)])
        let running = startUploadingDeviceToken(from: manager, to: api)
        var received = api.received.makeAsyncIterator()
        manager.didRegister(deviceToken: token(0xc))
        #expect(await received.next() == "put \(hex(0xc))")
        running.cancel()
        await running.value
        #expect(api.calls.all == ["put \(hex(0xc))", "put \(hex(0xc))"])
    }

    @Test func documentationShowsThisCode() throws {
        let here = URL(fileURLWithPath: #filePath)
        let root = here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let source = try String(contentsOf: here, encoding: .utf8)
        let docs = try String(contentsOf: root.appendingPathComponent("docs/library.md"), encoding: .utf8)
        for name in ["upload on change", "forge-push-token-server upload"] {
            let begin = "// BEGIN \(name)\n"
            let end = "// END \(name)\n"
            let example = try #require(
                source.range(of: begin).flatMap { start in
                    source.range(of: end, range: start.upperBound..<source.endIndex).map {
                        source[start.upperBound..<$0.lowerBound]
                    }
                })
            #expect(example.count > 200)
            #expect(docs.contains(example), "docs/library.md does not show the example \(name)")
        }
    }
}
