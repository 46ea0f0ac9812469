import Foundation
import Testing

import ForgePushToken

// The upload-on-change example of docs/library.md, compiled and tested here. The code between
// the two marker lines must match the example in docs/library.md character for character; the
// test `documentationShowsThisCode` checks it.

// BEGIN DeviceTokenUploader
/// Uploads the device token to your backend whenever it changes.
///
/// Skips `nil` (no token) and a token that was already uploaded. Retries a failed upload with
/// exponential backoff, and gives up on a token at its next retry once the manager holds another one.
actor DeviceTokenUploader {
    private let manager: PushTokenManager
    private let upload: @Sendable (String) async throws -> Void
    private let firstRetryDelay: UInt64  // nanoseconds
    private let maximumRetryDelay: UInt64  // nanoseconds
    private var lastUploaded: String?

    init(
        manager: PushTokenManager,
        firstRetryDelay: UInt64 = 2_000_000_000,
        maximumRetryDelay: UInt64 = 300_000_000_000,
        upload: @escaping @Sendable (String) async throws -> Void
    ) {
        self.manager = manager
        self.upload = upload
        self.firstRetryDelay = firstRetryDelay
        self.maximumRetryDelay = maximumRetryDelay
    }

    /// Runs until the calling task is cancelled.
    func run() async {
        for await token in manager.tokenStream {
            guard let token, token != lastUploaded else { continue }
            await uploadRetrying(token)
        }
    }

    private func uploadRetrying(_ token: String) async {
        var delay = firstRetryDelay
        while !Task.isCancelled, manager.token == token {
            do {
                try await upload(token)
                lastUploaded = token
                return
            } catch {
                try? await Task.sleep(nanoseconds: delay)
                delay = min(delay * 2, maximumRetryDelay)
            }
        }
    }
}
// END DeviceTokenUploader

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

/// A backend that fails the first upload of chosen tokens and reports every success.
private final class FakeBackend: Sendable {
    let failFirstAttemptOf: Set<String>
    let attempts = Recorded()
    let uploads: AsyncStream<String>
    private let uploaded: AsyncStream<String>.Continuation

    init(failFirstAttemptOf: Set<String>) {
        self.failFirstAttemptOf = failFirstAttemptOf
        (uploads, uploaded) = AsyncStream.makeStream(of: String.self)
    }

    @Sendable func upload(_ token: String) async throws {
        if attempts.append(token) == 0, failFirstAttemptOf.contains(token) {
            throw TestError(description: "backend unavailable")
        }
        uploaded.yield(token)
    }
}

@Suite("Documentation example", .timeLimit(.minutes(1)))
struct DocumentationExampleTests {
    @Test func uploaderUploadsEachNewTokenOnceAndRetriesFailures() async {
        let manager = PushTokenManager(logHandler: silent)
        let backend = FakeBackend(failFirstAttemptOf: [hex(0xb)])
        let uploader = DeviceTokenUploader(
            manager: manager, firstRetryDelay: 1_000_000, upload: backend.upload)
        let running = Task { await uploader.run() }
        var uploads = backend.uploads.makeAsyncIterator()

        manager.didRegister(deviceToken: token(0xa))
        #expect(await uploads.next() == hex(0xa))

        manager.didRegister(deviceToken: token(0xa))  // no change
        manager.didFailToRegister(error: TestError(description: "x"))  // nil: skipped
        manager.didRegister(deviceToken: token(0xa))  // already uploaded: skipped
        manager.didRegister(deviceToken: token(0xb))  // fails once, then retried
        #expect(await uploads.next() == hex(0xb))

        manager.didRegister(deviceToken: token(0xc))
        #expect(await uploads.next() == hex(0xc))

        running.cancel()
        await running.value
        #expect(backend.attempts.all == [hex(0xa), hex(0xb), hex(0xb), hex(0xc)])
    }

    @Test func uploaderGivesUpOnATokenThatWasReplaced() async {
        let manager = PushTokenManager(logHandler: silent)
        let attempts = Recorded()
        let (succeeded, success) = AsyncStream.makeStream(of: String.self)
        let uploader = DeviceTokenUploader(manager: manager, firstRetryDelay: 1_000_000) { value in
            // Token A never uploads; after its second attempt fails, B replaces it.
            if value == hex(0xa) {
                if attempts.append(value) == 1 {
                    manager.didRegister(deviceToken: token(0xb))
                }
                throw TestError(description: "rejected")
            }
            attempts.append(value)
            success.yield(value)
        }
        let running = Task { await uploader.run() }
        manager.didRegister(deviceToken: token(0xa))
        var successes = succeeded.makeAsyncIterator()
        #expect(await successes.next() == hex(0xb))
        running.cancel()
        await running.value
        #expect(attempts.all == [hex(0xa), hex(0xa), hex(0xb)])
    }

    @Test func documentationShowsThisCode() throws {
        let here = URL(fileURLWithPath: #filePath)
        let root = here.deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let source = try String(contentsOf: here, encoding: .utf8)
        let docs = try String(contentsOf: root.appendingPathComponent("docs/library.md"), encoding: .utf8)
        let begin = "// BEGIN DeviceTokenUploader\n", end = "// END DeviceTokenUploader\n"
        let example = try #require(source.range(of: begin).flatMap { start in
            source.range(of: end, range: start.upperBound..<source.endIndex).map { source[start.upperBound..<$0.lowerBound] }
        })
        #expect(docs.contains(example))
    }
}
