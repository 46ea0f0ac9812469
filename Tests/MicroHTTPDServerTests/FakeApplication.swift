import Dispatch
import ForgePushToken
import ForgePushTokenTestSupport
import HTTPServing
import ServerSupport

@testable import MicroHTTPDServer

/// The fake application's own routes (it knows nothing of the token service's `Route`: the
/// engine's tests build without TokenService). The paths are the service's, so that the engine's
/// path-dependent behaviour (the cached read's path) is exercised as in the service, but each
/// route does one thing the engine must carry.
enum FakeRoute: String, Sendable {
    /// Echoes its body and what the engine handed over of the head.
    case echo = "/register"
    /// Answers later, from another thread (a `PendingResponse`).
    case later = "/fail"
    /// The cached read (its body names the version).
    case cached = "/token"
    /// Opens a `FakeStream`.
    case stream = "/token/stream"
    /// Answers 204: any other path the engine treats alike.
    case other = "/"
}

/// A request the fake application admitted: its route and its head.
struct FakeAdmitted: Sendable {
    let route: FakeRoute
    let request: HTTPRequest
}

/// A small application for the engine's tests: no owner, no store, no token, routes of its own
/// (`FakeRoute`). `/register` echoes its body, `/fail` answers later from another thread,
/// `/token/stream` opens a `FakeStream`, `/token` is the cached read (its body names the
/// version), `/` answers 204, everything else 404. It records every call the engine
/// makes.
final class FakeApplication: HTTPApplication, HTTPCachedReads, HTTPTicks {
    let traits: HTTPApplicationTraits
    /// The version of the cached read; `bump()` moves it.
    private let version = Locked<UInt64>(0)
    /// Every finished request and its label, in order.
    let finished = Locked<[(request: FinishedRequest, label: FakeRoute?)]>([])
    /// Every engine event, in order.
    let events = Locked<[EngineEvent]>([])
    /// Streams open now, by id.
    let streams = Locked<[UInt64: FakeStream]>([:])
    /// Streams whose `close()` ran, by id.
    let closedStreams = Locked<[UInt64]>([])
    /// Ids the engine said the client left.
    let departed = Locked<[UInt64]>([])
    /// Heads admitted and requests answered, counted.
    let admitted = Counter()
    let cachedReads = Counter()
    let heartbeats = Counter()
    let seconds = Counter()
    private let nextID = Locked<UInt64>(1)

    /// `fillerFields` more header field names read before `X-Echo` (none by default): past the
    /// engine's 16 kept names, `X-Echo` and `q` are looked up instead (`HeadFieldCapture`).
    init(
        crossOrigin: CrossOriginPolicy = CrossOriginPolicy(), recordsEveryRequest: Bool = false,
        ticks: Bool = false, fillerFields: Int = 0
    ) {
        traits = HTTPApplicationTraits(
            crossOrigin: crossOrigin,
            headerFieldsRead: ["If-None-Match"] + (0..<fillerFields).map { "X-Filler-\($0)" } + ["X-Echo"],
            queryParametersRead: ["q"], recordsEveryRequest: recordsEveryRequest, wantsPeerAddresses: false,
            cachedReadPath: "/token", wantsTicks: ticks)
    }

    func admit(_ head: consuming HTTPRequest) -> HTTPAdmission<FakeAdmitted, FakeRoute?> {
        admitted.increment()
        guard let route = FakeRoute(rawValue: head.path) else {
            return .answer(.error(404, ServiceError("not_found", "no route")), label: nil)
        }
        return .proceed(FakeAdmitted(route: route, request: head), label: route)
    }

    func respond(to admitted: FakeAdmitted, body: [UInt8]) -> HTTPReply {
        switch admitted.route {
        case .echo:
            // The body, and what the engine handed over of the head.
            var headers: HTTPHeaders = [:]
            if let echo = admitted.request.headers["X-Echo"] { headers.add("X-Echo", echo) }
            if let query = admitted.request.query { headers.add("X-Query", query) }
            headers.add("X-Fields", String(admitted.request.headers.fields.count))
            return .response(HTTPResponse(status: 200, headers: headers, body: body))
        case .later:
            let pending = PendingResponse()
            DispatchQueue.global().async { pending.fulfil(HTTPResponse(status: 202, body: Array("later".utf8))) }
            return .later(pending)
        case .stream:
            return .eventStream
        case .cached:
            return .response(cachedRead().response)
        case .other:
            return .response(HTTPResponse(status: 204))
        }
    }

    func openStream(for admitted: FakeAdmitted, wake: @escaping @Sendable () -> Void) -> (HTTPResponse, FakeStream?) {
        let id = nextID.withLock { id in
            defer { id += 1 }
            return id
        }
        let stream = FakeStream(id: id, application: self, wake: wake)
        streams.withLock { $0[id] = stream }
        return (HTTPResponse(status: 200, headers: ServerSentEvents.responseHeaders), stream)
    }

    var answersCachedReadsBlindly: Bool { true }
    var cachedReadVersion: UInt64 { version.withLock { $0 } }

    func cachedRead() -> CachedRead {
        cachedReads.increment()
        let version = cachedReadVersion
        let body = Array("v\(version)".utf8)
        let tag = EntityTag.strong(digesting: body)
        return CachedRead(
            version: version, response: HTTPResponse(status: 200, headers: ["ETag": tag.fieldValue], body: body),
            notModified: HTTPResponse(status: 304, headers: ["ETag": tag.fieldValue]), entityTag: tag)
    }

    /// A new version of the cached read.
    func bump() {
        version.withLock { $0 += 1 }
    }

    func heartbeat() { heartbeats.increment() }
    func tick() { seconds.increment() }

    func clientLeft(stream id: UInt64) {
        departed.withLock { $0.append(id) }
        streams.withLock { $0[id] }?.end(abort: true)
    }

    func recordFinished(_ finished: FinishedRequest, label: FakeRoute?) {
        self.finished.withLock { $0.append((finished, label)) }
    }

    func record(_ event: EngineEvent) {
        events.withLock { $0.append(event) }
    }

    /// Ends every open stream (what a service's shutdown does before the engine stops).
    func endAll() {
        for stream in streams.withLock({ Array($0.values) }) { stream.end(abort: false) }
    }
}

/// A stream of the fake application: bytes pushed by the test, written in order; suspended
/// while there are none; wakes its connection exactly once per suspension.
final class FakeStream: HTTPEventSource, Sendable {
    private struct State {
        var pending: [UInt8] = []
        var suspended = false
        var ending: Bool?  // true: abort, false: finish
    }

    let id: UInt64
    private let state = Locked(State())
    private let wake: @Sendable () -> Void
    private unowned let application: FakeApplication

    init(id: UInt64, application: FakeApplication, wake: @escaping @Sendable () -> Void) {
        self.id = id
        self.application = application
        self.wake = wake
    }

    /// Sends `text` to the client.
    func push(_ text: String) {
        let resume = state.withLock { state in
            state.pending += Array(text.utf8)
            defer { state.suspended = false }
            return state.suspended
        }
        if resume { wake() }
    }

    /// Ends the stream: at once (`abort`), or cleanly after what is pending.
    func end(abort: Bool) {
        let resume = state.withLock { state in
            if state.ending != true { state.ending = abort }
            defer { state.suspended = false }
            return state.suspended
        }
        if resume { wake() }
    }

    func read(into buffer: UnsafeMutableRawBufferPointer, suspend: () -> Void) -> EventStreamRead {
        state.withLock { state in
            if state.ending == true { return .abort }
            guard state.pending.isEmpty else {
                let count = min(buffer.count, state.pending.count)
                buffer.copyBytes(from: state.pending.prefix(count))
                state.pending.removeFirst(count)
                return .bytes(count)
            }
            if state.ending == false { return .endOfStream }
            state.suspended = true
            suspend()
            return .suspended
        }
    }

    func close() {
        application.closedStreams.withLock { $0.append(id) }
        application.streams.withLock { _ = $0.removeValue(forKey: id) }
    }
}

/// The engine over a `FakeApplication` on a free loopback port, for one test.
final class FakeServer {
    let application: FakeApplication
    let server: MicroHTTPDServer<FakeApplication>
    let port: UInt16
    let lines = Locked<[String]>([])

    init(
        application: FakeApplication = FakeApplication(),
        _ configure: (inout ServerConfiguration) -> Void = { _ in },
        copySocket: @escaping @Sendable (Int32) -> Int32 = copyDescriptor
    ) throws {
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.heartbeatSeconds = 1
        configure(&configuration)
        let lines = self.lines
        let log = ServerLog(minimumLevel: .debug, format: .text) { line in lines.withLock { $0.append(line) } }
        self.application = application
        server = try MicroHTTPDServer(
            configuration: configuration, application: application, log: log, copySocket: copySocket)
        let authority = try server.start()
        guard let port = authority.split(separator: ":").last.flatMap({ UInt16($0) }) else {
            throw TestError(description: "no port in \(authority)")
        }
        self.port = port
    }

    /// Stops as a service would: the streams end, then the engine stops.
    func stop() {
        server.quiesce()
        application.endAll()
        server.stop()
    }

    deinit {
        // A manual clock runs free for the stop: its waits must end without the test.
        server.configuration.clock.runFree()
        stop()
    }

    func client() throws -> TestClient { try TestClient(port: port) }

    /// One request on a new connection.
    func request(_ method: String, _ target: String, body: [UInt8] = [], headers: [String: String] = [:]) throws
        -> TestResponse
    {
        let client = try client()
        defer { client.close() }
        return try client.request(method, target, body: body, headers: headers)
    }

    /// The finished requests recorded so far.
    var finished: [FinishedRequest] { application.finished.withLock { $0.map(\.request) } }

    /// The labels the finished requests were recorded with, in the same order.
    var labels: [FakeRoute?] { application.finished.withLock { $0.map(\.label) } }
}

/// The project's manual clock, read by the engine through `ServerClock.manual(_:)`.
extension ManualServerClock: ServerTimeSource {}
