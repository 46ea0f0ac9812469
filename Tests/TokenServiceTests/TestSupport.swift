import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenOwnerTestSupport
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

// Shared helpers of the TokenService tests. Nothing here opens a socket: requests go
// through `Responder.respond(to:body:)` and event streams are driven through `EventSubscriber.read`.

/// The `Content-Type` of every JSON body of the contract.
let jsonType = "application/json; charset=utf-8"

/// Thrown after an issue was recorded, to stop a test that cannot go on.
struct Unexpected: Error, CustomStringConvertible {
    var description: String
}

extension TokenOwner where Rendition == TokenSnapshot {
    /// Registers `deviceToken` as `POST /register` would; the snapshot after it.
    @discardableResult
    func register(deviceToken: [UInt8]) -> TokenSnapshot {
        TokenSnapshot(commitAndWait(self, lowerHex(deviceToken)).state!)
    }
}

extension Responder {
    /// `admit(_:)` and `respond(to:body:)` in one step, for a request whose body came with its head.
    func respond(to request: HTTPRequest) -> Reply {
        let body = request.body
        switch admit(request) {
        case .answer(let response, _): return .response(response)
        case .proceed(let admitted, _): return respond(to: admitted, body: body)
        }
    }

    /// Whether graceful shutdown began (`owner.stop()`).
    var isStopping: Bool { owner.isStopping }

    /// `StreamGate.open(for:wake:)` for a `GET /token/stream` from `origin`.
    func openEventStream(origin: String? = nil, wake: @escaping @Sendable () -> Void) -> (
        HTTPResponse, EventSubscriber?
    ) {
        var headers = HTTPHeaders()
        if let origin { headers.add("Origin", origin) }
        guard
            case .proceed(let admitted, _) = admit(
                HTTPRequest(
                    method: "GET", path: "/token/stream", query: nil,
                    headers: headers))
        else {
            preconditionFailure("GET /token/stream is always admitted without a token")
        }
        let (head, subscription) = streams.open(for: admitted, wake: wake)
        return (head, subscription?.subscriber)
    }
}

/// A fresh owner of no token, in memory.
func makeOwner(maxSubscribers: Int = 16) -> TokenOwner<TokenSnapshot> {
    TokenOwner(store: MemoryTokenStore(), initial: .initial, maxSubscribers: maxSubscribers)
}

/// A `ServerLog` that hands each message to `handler` with its level (the recorder's view).
func serverLog(_ handler: @escaping PushTokenManager.LogHandler) -> ServerLog {
    let levels: [String: PushTokenManager.LogLevel] = [
        "debug": .debug, "info": .info, "warning": .warning, "error": .error,
    ]
    return ServerLog(minimumLevel: .debug) { line in
        // "<timestamp> <level> <message>\n"
        let parts = line.dropLast().split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3, let level = levels[String(parts[1])] else { return }
        handler(level, String(parts[2]))
    }
}

/// A fresh responder around a fresh owner, logging to `log`.
func makeResponder(maxSubscribers: Int = 16, log: @escaping PushTokenManager.LogHandler = quiet) -> Responder {
    Service(store: MemoryTokenStore(), settings: .init(maxSubscribers: maxSubscribers), log: serverLog(log)).responder
}

/// The UTF-8 bytes of `text`.
func utf8(_ text: String) -> [UInt8] {
    Array(text.utf8)
}

/// `bytes` as text (for messages and comparisons of ASCII bodies).
func string(_ bytes: [UInt8]) -> String {
    String(decoding: bytes, as: UTF8.self)
}

/// Lowercase hex of `bytes`, computed independently of `DeviceTokenHex`.
func lowerHex(_ bytes: [UInt8]) -> String {
    let digits = Array("0123456789abcdef")
    return String(bytes.flatMap { [digits[Int($0 / 16)], digits[Int($0 % 16)]] })
}

/// `count` bytes that differ from one another in a recognisable way.
func tokenBytes(_ count: Int, seed: UInt8 = 0) -> [UInt8] {
    (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ Int(seed) &+ 1) }
}

extension Responder {
    /// The reply to one request, built from its parts.
    func reply(
        _ method: String, _ target: String, contentType: String? = nil, body: [UInt8] = [],
        headers: HTTPHeaders = HTTPHeaders()
    ) -> Reply {
        var all = headers
        if let contentType { all.add("Content-Type", contentType) }
        return respond(to: HTTPRequest(method: method, target: target, headers: all, body: body))
    }

    /// The complete response to one request; records an issue and throws if the reply is a stream.
    func send(
        _ method: String, _ target: String, contentType: String? = nil, body: [UInt8] = [],
        headers: HTTPHeaders = HTTPHeaders(),
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> HTTPResponse {
        switch reply(method, target, contentType: contentType, body: body, headers: headers) {
        case .response(let response):
            return response
        case .eventStream:
            Issue.record(
                "\(method) \(target): expected a complete response, got .eventStream",
                sourceLocation: sourceLocation)
            throw Unexpected(description: "event stream")
        case .later(let pending):
            // A store that answers on its own thread (the state file's group commit): wait for it.
            let answered = DispatchSemaphore(value: 0)
            if let response = pending.take(orPark: {}, resume: { answered.signal() }) { return response }
            answered.wait()
            guard let response = pending.take(orPark: {}, resume: {}) else {
                throw Unexpected(description: "resumed without a response")
            }
            return response
        }
    }
}

extension Responder {
    /// The complete response to one request as the engine sends it: its header completed in the
    /// engine's one place (`ResponseHeaders.completing`: the CORS fields for the request's
    /// `Origin`, then the defaults).
    func sent(
        _ method: String, _ target: String, contentType: String? = nil, body: [UInt8] = [],
        headers: HTTPHeaders = HTTPHeaders(),
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> HTTPResponse {
        var response = try send(
            method, target, contentType: contentType, body: body, headers: headers, sourceLocation: sourceLocation)
        response.headers = completed(response.headers, origin: headers["Origin"])
        return response
    }

    /// `headers` completed as the engine completes an answer's to a request from `origin`.
    func completed(_ headers: HTTPHeaders, origin: String?) -> HTTPHeaders {
        ResponseHeaders.completing(headers, crossOrigin: access.crossOrigin, origin: origin)
    }
}

/// The top-level JSON object of `body`.
func jsonObject(_ body: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) throws -> [String: Any] {
    let value = try JSONSerialization.jsonObject(with: Data(body), options: [.fragmentsAllowed])
    guard let object = value as? [String: Any] else {
        Issue.record("not a JSON object: \(string(body))", sourceLocation: sourceLocation)
        throw Unexpected(description: "not a JSON object")
    }
    return object
}

/// Checks an error response: status, JSON content type, exactly the keys `error` and `message`,
/// the code, a non-empty message. Returns the message.
@discardableResult
func expectError(
    _ response: HTTPResponse, status: Int, code: String,
    sourceLocation: SourceLocation = #_sourceLocation
) throws -> String {
    #expect(response.status == status, "body: \(string(response.body))", sourceLocation: sourceLocation)
    #expect(response.headers["Content-Type"] == jsonType, sourceLocation: sourceLocation)
    let object = try jsonObject(response.body, sourceLocation: sourceLocation)
    #expect(Set(object.keys) == ["error", "message"], "body: \(string(response.body))", sourceLocation: sourceLocation)
    #expect(object["error"] as? String == code, "body: \(string(response.body))", sourceLocation: sourceLocation)
    let message = object["message"] as? String
    #expect(
        message?.isEmpty == false, "message must be a non-empty string: \(string(response.body))",
        sourceLocation: sourceLocation)
    // The same body through a Decodable, as a client would read it.
    struct ErrorBody: Decodable {
        let error: String
        let message: String
    }
    let decoded = try JSONDecoder().decode(ErrorBody.self, from: Data(response.body))
    #expect(decoded.error == code, sourceLocation: sourceLocation)
    return message ?? ""
}

/// The body of `POST /register` and `POST /fail`.
struct ChangeReply: Decodable, Equatable {
    let token: String?
    let changed: Bool
}

/// Checks a `200` change response: JSON content type, exactly the keys `token` and `changed`
/// (`token` present even when null), and their values.
func expectChange(
    _ response: HTTPResponse, token: String?, changed: Bool,
    sourceLocation: SourceLocation = #_sourceLocation
) throws {
    #expect(response.status == 200, "body: \(string(response.body))", sourceLocation: sourceLocation)
    #expect(response.headers["Content-Type"] == jsonType, sourceLocation: sourceLocation)
    let object = try jsonObject(response.body, sourceLocation: sourceLocation)
    #expect(Set(object.keys) == ["token", "changed"], "body: \(string(response.body))", sourceLocation: sourceLocation)
    let decoded = try JSONDecoder().decode(ChangeReply.self, from: Data(response.body))
    #expect(
        decoded == ChangeReply(token: token, changed: changed), "body: \(string(response.body))",
        sourceLocation: sourceLocation)
}

// MARK: - Driving an event subscriber

/// The bytes a buffer is filled with before a read, to see what the read wrote.
let sentinel: UInt8 = 0xEE

/// One `read(into:suspend:)` with a buffer of `size` bytes: its result, the bytes written and how
/// often `suspend` was called. Checks that nothing past the reported count was written.
func readOnce(
    _ subscriber: EventSubscriber, size: Int = 4096,
    sourceLocation: SourceLocation = #_sourceLocation
) -> (result: EventSubscriber.ReadResult, bytes: [UInt8], suspends: Int) {
    let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: size, alignment: 1)
    defer { buffer.deallocate() }
    buffer.initializeMemory(as: UInt8.self, repeating: sentinel)
    var suspends = 0
    let result = subscriber.read(into: buffer) { suspends += 1 }
    var written = 0
    if case .bytes(let count) = result {
        #expect(
            count > 0 && count <= size, "read reported \(count) bytes for a buffer of \(size)",
            sourceLocation: sourceLocation)
        written = max(0, min(count, size))
    }
    #expect(
        buffer[written...].allSatisfy { $0 == sentinel }, "read wrote past the count it reported",
        sourceLocation: sourceLocation)
    return (result, Array(buffer[..<written]), suspends)
}

/// Reads until a read returns something other than `.bytes`: all the bytes, that last result,
/// the number of reads that gave bytes and the calls of `suspend`. At most `limit` reads.
func drain(
    _ subscriber: EventSubscriber, size: Int = 4096, limit: Int = 100_000,
    sourceLocation: SourceLocation = #_sourceLocation
)
    -> (bytes: [UInt8], result: EventSubscriber.ReadResult, byteReads: Int, suspends: Int)
{
    var bytes: [UInt8] = []
    var byteReads = 0
    var suspends = 0
    for _ in 0..<limit {
        let step = readOnce(subscriber, size: size, sourceLocation: sourceLocation)
        suspends += step.suspends
        guard case .bytes = step.result else {
            return (bytes, step.result, byteReads, suspends)
        }
        bytes += step.bytes
        byteReads += 1
    }
    Issue.record("the subscriber never stopped giving bytes", sourceLocation: sourceLocation)
    return (bytes, .abort, byteReads, suspends)
}

/// The ids of the complete events in an event-stream text, in order.
func eventIDs(_ bytes: [UInt8]) -> [UInt64] {
    string(bytes).components(separatedBy: "\n\n").compactMap { block -> UInt64? in
        guard let line = block.split(separator: "\n").first(where: { $0.hasPrefix("id: ") }) else { return nil }
        return UInt64(line.dropFirst(4))
    }
}

/// The exact event of `token` at `version`.
func expectedEvent(_ version: UInt64, _ token: String?) -> String {
    let data = token.map { #"{"token":"\#($0)"}"# } ?? #"{"token":null}"#
    return "id: \(version)\nevent: token\ndata: \(data)\n\n"
}

/// The project's manual clock, read by the service through `ServerClock.manual(_:)`.
extension ManualServerClock: ServerTimeSource {}
