import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif
#if canImport(Glibc)
    import Glibc
#endif

/// The library's upload API with a `URLSession` upload function (docs/library.md's
/// `forgePushTokenServerUpload(baseURL:)`) against a real forge-push-token-server.
///
/// The server is the binary `swift build --build-tests` builds beside this test bundle (in the
/// same configuration and scratch folder, so the sanitizer runs use a sanitized server), started
/// on a free loopback port and stopped by its process id (SIGTERM). Set `FORGE_PUSH_TOKEN_SERVER` to use
/// another binary.
@Suite("End to end: uploads to forge-push-token-server", serverIsBuilt, hangGuard())
struct ServerUploadEndToEndTests {
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func tokensLandOnTheServerAndARetryLandsAfterARestart() async throws {
        // A heartbeat every second ends the curl that read the stream soon after its event.
        var server = try await ServerProcess.start(port: 0, arguments: ["--heartbeat", "1"])
        defer { server.stop() }
        let port = server.port
        let base = try #require(URL(string: "http://127.0.0.1:\(port)"))
        let log = LogRecorder()
        let manager = PushTokenManager(logHandler: log.handler)
        let policy = try PushTokenManager.UploadRetryPolicy(
            initialDelay: .milliseconds(50), maximumDelay: .milliseconds(400), jitter: 0.5)
        let uploads = Task {
            await manager.uploadTokenChanges(
                retryPolicy: policy, serverRecord: MemoryServerRecordStore(),
                upload: forgePushTokenServerUpload(baseURL: base))
        }

        // A token registered on the manager reaches GET /token and GET /token/stream.
        let first = Data((0..<32).map { UInt8($0) })
        let firstHex = DeviceTokenHex.encode(first)
        manager.didRegister(deviceToken: first)
        try await waitUntil("GET /token to serve the first token") { try await serverToken(base) == firstHex }
        let event = "data: {\"token\":\"\(firstHex)\"}"
        let events = try readEventStream(base.appendingPathComponent("token/stream"), until: event)
        #expect(events.contains(event))

        // The server goes away; the next token's upload fails and is retried with backoff...
        server.stop()
        let second = Data((0..<32).map { UInt8(255 - $0) })
        let secondHex = DeviceTokenHex.encode(second)
        manager.didRegister(deviceToken: second)
        await waitUntil("a log line saying \"retrying in\"") {
            log.recorded.contains { $0.message.contains("retrying in") }
        }

        // ...and lands once the server is back on the same port.
        server = try await ServerProcess.start(port: port)
        try await waitUntil("GET /token to serve the second token") { try await serverToken(base) == secondHex }

        // The app loses its token: the server's is cleared.
        manager.didFailToRegister(error: TestError(description: "revoked"))
        try await waitUntil("GET /token to serve no token") { try await serverToken(base) == .some(nil) }

        uploads.cancel()
        await uploads.value
        let messages = log.recorded.map(\.message)
        #expect(messages.allSatisfy { !$0.contains(firstHex) && !$0.contains(secondHex) })
    }

    /// A permanent refusal (`401`: the server wants a bearer token this upload does not send) is
    /// given up at once, not retried: the next attempt is the next token's.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    @Test func aRefusedUploadIsGivenUpNotRetried() async throws {
        let server = try await ServerProcess.start(port: 0, arguments: ["--auth-token", "e2e-secret-0123456789"])
        defer { server.stop() }
        let base = try #require(URL(string: "http://127.0.0.1:\(server.port)"))
        let log = LogRecorder()
        let manager = PushTokenManager(logHandler: log.handler)
        let uploads = Task {
            await manager.uploadTokenChanges(
                serverRecord: MemoryServerRecordStore(), upload: forgePushTokenServerUpload(baseURL: base))
        }
        let gaveUp = "device token upload failed (attempt 1): the upload gave up; waiting for a new value or a re-send"

        manager.didRegister(deviceToken: Data((0..<32).map { UInt8($0) }))
        await waitUntil(#"log.recorded.count == 1"#) { log.recorded.count == 1 }
        manager.didRegister(deviceToken: Data((0..<32).map { UInt8(255 - $0) }))
        await waitUntil(#"log.recorded.count == 2"#) { log.recorded.count == 2 }
        // Two attempts, one per token, each given up: no retry of the first came between them.
        #expect(log.recorded.map(\.message) == [gaveUp, gaveUp])
        #expect(try await serverToken(base) == .some(nil))

        uploads.cancel()
        await uploads.value
    }
}

/// The token the server at `base` holds (`GET /token`): `.some(nil)` when it has none, `nil` when
/// the server cannot be reached.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
private func serverToken(_ base: URL) async throws -> String?? {
    struct Body: Decodable { var token: String? }
    guard let (data, response) = try? await URLSession.shared.data(from: base.appendingPathComponent("token")) else {
        return nil
    }
    #expect((response as? HTTPURLResponse)?.statusCode == 200)
    return .some(try JSONDecoder().decode(Body.self, from: data).token)
}

/// The event stream at `url`, read with curl (`-N`: unbuffered) until a line holding `text` has
/// come (`grep -m1` then exits, and curl with it at the stream's next write, a heartbeat). The
/// event ends the read, not a time (docs/testing.md, "Waiting in tests"): curl's `--max-time` of
/// 60 s only guards against a hang. Returns the line, or nothing.
private func readEventStream(_ url: URL, until text: String) throws -> String {
    let data = try standardOutput(
        of: "/bin/sh",
        arguments: ["-c", #"curl -sN --max-time 60 "$0" | grep -m1 -F -- "$1""#, url.absoluteString, text])
    return String(decoding: data, as: UTF8.self)
}

/// The server is part of the package only on Linux (Package.swift); elsewhere, such as `swift test`
/// on a Mac, the end-to-end suite is disabled, and says why.
#if os(Linux)
    let serverIsBuilt = ConditionTrait.enabled(if: true)
#else
    let serverIsBuilt = ConditionTrait.disabled("forge-push-token-server builds only on Linux (Package.swift)")
#endif

/// A forge-push-token-server child process on 127.0.0.1.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
struct ServerProcess {
    let process: Process
    let port: Int

    /// The server binary: `FORGE_PUSH_TOKEN_SERVER`, or the one built beside this test bundle.
    static var binary: URL {
        if let path = ProcessInfo.processInfo.environment["FORGE_PUSH_TOKEN_SERVER"], !path.isEmpty {
            return URL(fileURLWithPath: path)
        }
        let bundle = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        return bundle.deletingLastPathComponent().appendingPathComponent("forge-push-token-server")
    }

    /// Starts the server on `port` (0: a free port found first), with the extra command-line
    /// `arguments`, and waits until it answers
    /// `GET /healthz`.
    ///
    /// Readiness is polled rather than read from the server's "listening on" line: the server's
    /// standard output is block-buffered when it is a pipe, so the line arrives late.
    static func start(port: Int, arguments: [String] = []) async throws -> ServerProcess {
        let binary = binary
        guard FileManager.default.isExecutableFile(atPath: binary.path) else {
            throw TestError(description: "no server binary at \(binary.path): run swift build --build-tests first")
        }
        let port = port == 0 ? try ForgePushTokenTestSupport.freeLoopbackPort() : port
        let process = Process()
        process.executableURL = binary
        process.arguments = ["--host", "127.0.0.1", "--port", "\(port)", "--access-log", "off"] + arguments
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let server = ServerProcess(process: process, port: port)
        let health = try #require(URL(string: "http://127.0.0.1:\(port)/healthz"))
        // Waits for the answer, not for a time (a server built with Thread Sanitizer, started on a
        // loaded machine, can take seconds to listen); the wait's bound only guards against a hang.
        let answered = try await waitUntil("the server started on port \(port) to answer GET /healthz") {
            guard process.isRunning else {
                throw TestError(description: "the server exited with status \(process.terminationStatus)")
            }
            guard let (_, response) = try? await URLSession.shared.data(from: health) else { return false }
            return (response as? HTTPURLResponse)?.statusCode == 200
        }
        if answered { return server }
        server.stop()
        throw TestError(description: "the server did not answer GET /healthz")
    }

    /// Stops the server (SIGTERM, a graceful shutdown) and waits for it to exit. Idempotent.
    func stop() {
        if process.isRunning {
            process.terminate()
        }
        process.waitUntilExit()
    }
}
