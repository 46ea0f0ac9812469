import Dispatch
import ForgePushToken
import ForgePushTokenHTTP
import ForgePushTokenTestSupport
import MicroHTTPDServer
import ServiceLogging

/// A small application for the engine's tests: no owner, no store, no token. Each route does one
/// thing the engine must carry: `/register` echoes its body, `/fail` answers later from another
/// thread, `/token/stream` opens a `FakeStream`, `/token` is the cached read (its body names the
/// version), everything else 204. It records every call the engine makes.
final class FakeApplication: HTTPApplication {
    let crossOrigin: CrossOriginPolicy
    let recordsEveryRequest: Bool
    let wantsTicks: Bool
    /// The version of the cached read; `bump()` moves it.
    private let version = Locked<UInt64>(0)
    /// Every finished request, in order.
    let finished = Locked<[FinishedRequest]>([])
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
        self.crossOrigin = crossOrigin
        self.recordsEveryRequest = recordsEveryRequest
        self.wantsTicks = ticks
        self.headerFieldsRead = ["If-None-Match"] + (0..<fillerFields).map { "X-Filler-\($0)" } + ["X-Echo"]
    }

    let headerFieldsRead: [String]
    let queryParametersRead = ["q"]

    func admit(_ head: consuming HTTPRequest) -> HTTPAdmission {
        admitted.increment()
        guard let route = Route(path: head.path) else {
            return .answer(.error(404, ServiceError("not_found", "no route")), route: nil)
        }
        return .proceed(AdmittedRequest(route: route, request: head))
    }

    func respond(to admitted: AdmittedRequest) -> HTTPReply {
        switch admitted.route {
        case .register:
            // The body, and what the engine handed over of the head.
            var headers: HTTPHeaders = [:]
            if let echo = admitted.request.headers["X-Echo"] { headers.add("X-Echo", echo) }
            if let query = admitted.request.query { headers.add("X-Query", query) }
            headers.add("X-Fields", String(admitted.request.headers.fields.count))
            return .response(HTTPResponse(status: 200, headers: headers, body: admitted.request.body))
        case .fail:
            let pending = PendingResponse()
            DispatchQueue.global().async { pending.fulfil(HTTPResponse(status: 202, body: Array("later".utf8))) }
            return .later(pending)
        case .stream:
            return .eventStream
        case .token:
            return .response(cachedRead().response)
        default:
            // Any other route of the service: the engine treats them all alike, so a new route
            // changes nothing here (docs/architecture.md, "Adding a route").
            return .response(HTTPResponse(status: 204))
        }
    }

    func openStream(for admitted: AdmittedRequest, wake: @escaping @Sendable () -> Void) -> (HTTPResponse, FakeStream?)
    {
        let id = nextID.withLock { id in
            defer { id += 1 }
            return id
        }
        let stream = FakeStream(id: id, application: self, wake: wake)
        streams.withLock { $0[id] = stream }
        return (HTTPResponse(status: 200, headers: ServerSentEvents.responseHeaders), stream)
    }

    let cachedReadPath: StaticString = "/token"
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

    var wantsPeerAddresses: Bool { false }

    func recordFinished(_ finished: FinishedRequest) {
        self.finished.withLock { $0.append(finished) }
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

    init(application: FakeApplication = FakeApplication(), _ configure: (inout ServerConfiguration) -> Void = { _ in })
        throws
    {
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configuration.heartbeatSeconds = 1
        configure(&configuration)
        let lines = self.lines
        let log = ServerLog(minimumLevel: .debug, format: .text) { line in lines.withLock { $0.append(line) } }
        self.application = application
        server = try MicroHTTPDServer(configuration: configuration, application: application, log: log)
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
    var finished: [FinishedRequest] { application.finished.withLock { $0 } }
}
