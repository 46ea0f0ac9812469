/// What an HTTP engine serves: the one protocol between an engine (the libmicrohttpd adapter,
/// `MicroHTTPDServer`) and an application (the token service's `Responder`), modelled on
/// hummingbird's `HTTPResponder` (one call that turns a request into a response), widened by what
/// an engine that parses, suspends and streams in C needs (docs/architecture.md, "The engine's
/// protocol"). Six requirements:
///
/// 1. **Traits** (`traits`): what the engine reads once, at start (CORS, the header fields and
///    query parameters the application reads, whether to record every request or peer addresses).
/// 2. **Admit a head** (`admit(_:)`): once the method, target and header fields have arrived,
///    before any body is read, so that a refused request's body is never kept. The application
///    keeps what it decided in its own `Admitted` value, and names the request for the records
///    with its own `Label` (the token service: its route).
/// 3. **Answer it** (`respond(to:body:)`): with the admitted request and its whole body; a
///    complete response, an event stream (`openStream(for:wake:)`), or a response decided later
///    (a `PendingResponse`).
/// 4. **Open a stream** (`openStream(for:wake:)`).
/// 5. **Record** (`recordFinished(_:label:)`, `record(_:)`): each finished request, and what the engine
///    refused on its own.
///
/// Two small optional protocols add what only some applications have: `HTTPCachedReads` (one
/// `GET` the engine answers from a response it keeps per version) and `HTTPTicks` (the heartbeat,
/// the ticks and the departures of stream clients, which only the engine sees). The engine asks
/// whether its application conforms once, at start.
///
/// The engine is generic over its application (`MicroHTTPDServer<Application>`), so no call of
/// this protocol goes through an existential; the application knows nothing of the engine. The
/// engine completes every answer's header with `traits.crossOrigin` (`ResponseHeaders.completing`),
/// its own answers (`EngineAnswers`) included.
///
/// Thread-safety: every member may be called from any thread, concurrently (an engine calls from
/// each of its threads).
public protocol HTTPApplication: Sendable {
    /// A request whose head `admit(_:)` let through, as the application keeps it until
    /// `respond(to:body:)` (the token service: the route, the request, the grant).
    associatedtype Admitted: Sendable
    /// How the application names a request in its records (`recordFinished(_:label:)`; the token
    /// service: its `Route?`), with a value for a request it did not name (`unlabelled`).
    associatedtype Label: HTTPRequestLabel & Sendable
    /// One open event stream, as the engine's content reader drives it.
    associatedtype EventSource: HTTPEventSource

    /// What the engine reads once, at start (`HTTPApplicationTraits`).
    var traits: HTTPApplicationTraits { get }

    /// What a request's head alone decides: an answer (404, 405, 401, 403, `OPTIONS`), or to
    /// read the body and call `respond(to:body:)`. Called once per request, as soon as the head
    /// has arrived; never for a request the engine refused itself (its target or framing). The
    /// head is handed over (`consuming`): an application that keeps it, in `Admitted`, moves it
    /// there instead of copying its fields.
    func admit(_ head: consuming HTTPRequest) -> HTTPAdmission<Admitted, Label>

    /// The reply to an admitted request, with its whole `body` (empty when there was none). Never
    /// throws: every failure is an error response.
    func respond(to admitted: Admitted, body: [UInt8]) -> HTTPReply

    /// Opens the event stream `respond(to:body:)` asked for with `.eventStream`.
    /// - Parameters:
    ///   - admitted: the request (the token service: its `Last-Event-ID`, its grant).
    ///   - wake: resumes the stream's connection; the source calls it as `HTTPEventSource` says.
    /// - Returns: the response head and the open source, or a refusal (a 503) and `nil`.
    func openStream(for admitted: Admitted, wake: @escaping @Sendable () -> Void) -> (
        HTTPResponse, EventSource?
    )

    /// Counts and logs one finished request (answered, or its connection closed), with the label
    /// `admit(_:)` gave it, or `Label.unlabelled` when the engine did not ask (a request it
    /// refused on its own, or answered from its cache; the application may name such a request
    /// by its `path`).
    func recordFinished(_ finished: FinishedRequest, label: Label)

    /// Counts something the engine did on its own (`EngineEvent`).
    func record(_ event: EngineEvent)
}

/// What an engine reads of its application once, at start (`HTTPApplication.traits`): nothing
/// here is asked per request.
///
/// A value type; `Sendable`.
public struct HTTPApplicationTraits: Sendable {
    /// Which other origins' browser pages may read the responses: the engine adds the CORS fields
    /// to every answer under it.
    public var crossOrigin: CrossOriginPolicy
    /// The header fields `admit(_:)` and `respond(to:body:)` read: the engine hands over these
    /// alone, in this order (a field not named here never reaches the application).
    public var headerFieldsRead: [String]
    /// The query parameters they read: the engine hands over the query as these alone,
    /// `name=value` joined by `&`, each value percent-encoded again (libmicrohttpd has decoded it).
    public var queryParametersRead: [String]
    /// Whether every request must be recorded with its method, path and duration (an access log):
    /// the engine then takes no shortcut that leaves them out (the cached read's, which records
    /// no duration).
    public var recordsEveryRequest: Bool
    /// Whether `FinishedRequest.remote` is wanted, so that the engine looks it up only then.
    public var wantsPeerAddresses: Bool
    /// The path whose `GET` and `HEAD` the engine may answer from its cache, for an application
    /// that is `HTTPCachedReads` (the token service: `/token`), as a NUL-terminated static string
    /// the engine compares in place; `nil` for none.
    public var cachedReadPath: StaticString?
    /// Whether `HTTPTicks.tick()` has anything to do (the token service: a stream age limit).
    public var wantsTicks: Bool

    /// The traits of an application; by default one that reads no header field and no query
    /// parameter, allows no other origin, records no peer address nor every request, and has no
    /// cached read and no ticks.
    public init(
        crossOrigin: CrossOriginPolicy = CrossOriginPolicy(), headerFieldsRead: [String] = [],
        queryParametersRead: [String] = [], recordsEveryRequest: Bool = false, wantsPeerAddresses: Bool = false,
        cachedReadPath: StaticString? = nil, wantsTicks: Bool = false
    ) {
        self.cachedReadPath = cachedReadPath
        self.wantsTicks = wantsTicks
        self.crossOrigin = crossOrigin
        self.headerFieldsRead = headerFieldsRead
        self.queryParametersRead = queryParametersRead
        self.recordsEveryRequest = recordsEveryRequest
        self.wantsPeerAddresses = wantsPeerAddresses
    }
}

/// The cached read, for an application that has one (optional; `MicroHTTPDServer` asks once, at
/// start, whether its application conforms): one `GET` path the engine may answer from a response
/// it keeps per version, without asking anything else, and without allocating.
///
/// Thread-safety: every member may be called from any thread, concurrently.
public protocol HTTPCachedReads: Sendable {
    /// Whether a `GET` or `HEAD` of `HTTPApplicationTraits.cachedReadPath` may be answered from the cache now, without
    /// asking `admit(_:)`: no header field (but `If-None-Match`, which the engine reads itself)
    /// can change its answer. Asked once per request: cheap, no allocation.
    var answersCachedReadsBlindly: Bool { get }

    /// The version of the cached read's answer now: the engine rebuilds its cached response when
    /// it changes. Asked once per cached read: cheap, no allocation.
    var cachedReadVersion: UInt64 { get }

    /// The cached read's answers for the current version: asked once per version.
    func cachedRead() -> CachedRead
}

/// The engine's clock and the departures of stream clients, for an application that has event
/// streams (optional; `MicroHTTPDServer` asks once, at start, whether its application conforms).
///
/// Thread-safety: every member may be called from any thread (the engine calls them from its
/// watcher thread).
public protocol HTTPTicks: Sendable {
    /// One heartbeat period (`--heartbeat-seconds`) has passed: idle streams get a heartbeat.
    func heartbeat()

    /// About `tickMilliseconds` (50 ms) have passed: the streams' age limits are checked this
    /// often, so that their ends can be paced within 100 ms slices. Only called when
    /// `HTTPApplicationTraits.wantsTicks`.
    func tick()

    /// The client of stream `id` (`HTTPEventSource.id`) has left: the stream ends at once. An id
    /// no longer open is ignored.
    func clientLeft(stream id: UInt64)
}

/// One open event stream, as the engine reads it: a conflating source that writes its bytes into
/// the engine's buffer, or asks the engine to suspend the connection until it has some
/// (`EventSubscriber` in this service).
///
/// The wake-up protocol: with nothing to write, `read(into:suspend:)` calls `suspend` under the
/// source's own lock and returns `.suspended`; the source then calls the `wake` it was opened
/// with exactly once, outside its lock, when it has work again. So the engine resumes a
/// connection only while it is suspended, and exactly once.
///
/// Thread-safety: `read` is called from the connection's thread only; `close()` once, from it.
public protocol HTTPEventSource: Sendable {
    /// The stream's id, unique while it is open (`HTTPTicks.clientLeft(stream:)`).
    var id: UInt64 { get }

    /// Writes the next bytes of the stream into `buffer`, or calls `suspend` and returns
    /// `.suspended`, or says how the stream ends.
    func read(into buffer: UnsafeMutableRawBufferPointer, suspend: () -> Void) -> EventStreamRead

    /// The stream's connection is gone (its response was freed): forget it and count its end.
    /// Called once.
    func close()
}

/// What one read of an event stream gave the engine.
public enum EventStreamRead: Sendable, Equatable {
    /// `count` bytes were written into the buffer.
    case bytes(Int)
    /// Nothing to write: `suspend` was called; the connection waits for a wake-up.
    case suspended
    /// End the response cleanly (the chunked body's terminator).
    case endOfStream
    /// Close the connection without a clean end.
    case abort
}

/// What the head of a request decided (`HTTPApplication.admit(_:)`), with the application's label
/// for the request's records (`HTTPApplication.recordFinished(_:label:)`).
public enum HTTPAdmission<Admitted: Sendable, Label: HTTPRequestLabel & Sendable>: Sendable {
    /// Answer this, without carrying the request out (its body, if any, is not needed); `label`
    /// names the request in its records (`Label.unlabelled` when the application has no name for
    /// it, such as an unknown path).
    case answer(HTTPResponse, label: Label)
    /// Read the body (if any) and call `respond(to:body:)` with `admitted`.
    case proceed(Admitted, label: Label)
}

/// What to send for one admitted request (`HTTPApplication.respond(to:body:)`).
public enum HTTPReply: Sendable {
    /// A complete response.
    case response(HTTPResponse)
    /// Start an event stream: the engine calls `openStream(for:wake:)`.
    case eventStream
    /// The response is decided later (a write in flight): see `PendingResponse`.
    case later(PendingResponse)
}

/// How an application names a request in its records (`HTTPApplication.Label`, which is also
/// `Sendable`): a value with one that names none. An optional is one (`nil`): the token service's
/// label is a `Route?`.
public protocol HTTPRequestLabel {
    /// The label of a request the application did not name (the engine refused it on its own, or
    /// answered it from its cache).
    static var unlabelled: Self { get }
}

extension Optional: HTTPRequestLabel {
    /// `nil`.
    public static var unlabelled: Self { nil }
}

/// One finished request, for the metrics and the access log (`HTTPApplication.recordFinished`,
/// which gets the request's label beside it: the engine's code is not specialised for its
/// application, and a record generic over the label looked up its generic metadata on every
/// request, docs/performance.md).
///
/// A value type; `Sendable`.
public struct FinishedRequest: Sendable {
    /// The method, as received.
    public var method: String
    /// The path, without the query (which may hold a bearer token).
    public var path: String
    /// The status sent, or 0 when none was.
    public var status: Int
    /// Body bytes sent.
    public var bytes: Int
    /// Microseconds from the head's arrival to the end; `nil` when not timed (the engine's
    /// cached read), and not observed for event streams.
    public var microseconds: Int?
    /// Whether it was an event stream (its duration is not a latency).
    public var wasStream: Bool
    /// The peer's address (`host:port`, IPv6 in brackets; behind a proxy, the proxy's), when
    /// the application asked for it (`HTTPApplicationTraits.wantsPeerAddresses`).
    public var remote: String?

    /// A finished request.
    public init(
        method: String, path: String, status: Int, bytes: Int, microseconds: Int?, wasStream: Bool,
        remote: String? = nil
    ) {
        self.method = method
        self.path = path
        self.status = status
        self.bytes = bytes
        self.microseconds = microseconds
        self.wasStream = wasStream
        self.remote = remote
    }
}

/// The cached read's answers for one version (`HTTPCachedReads.cachedRead()`): the 200 and its
/// `304 Not Modified`, and the tag an `If-None-Match` is compared with.
///
/// A value type; `Sendable`.
public struct CachedRead: Sendable {
    /// The version these answers are for (`HTTPCachedReads.cachedReadVersion`).
    public var version: UInt64
    /// The 200 (for `HEAD`, the engine sends its header fields alone).
    public var response: HTTPResponse
    /// The `304 Not Modified` for a request whose `If-None-Match` names `entityTag`.
    public var notModified: HTTPResponse
    /// The `ETag` of `response`.
    public var entityTag: EntityTag

    /// The answers for `version`.
    public init(version: UInt64, response: HTTPResponse, notModified: HTTPResponse, entityTag: EntityTag) {
        self.version = version
        self.response = response
        self.notModified = notModified
        self.entityTag = entityTag
    }
}

/// What an engine did on its own, for the application's counters (`HTTPApplication.record(_:)`).
public enum EngineEvent: Sendable, Equatable {
    /// A new connection was closed at once: `--max-connections` was reached.
    case connectionRefusedTotalLimit
    /// A new connection was closed at once: its address reached `--max-connections-per-ip`.
    case connectionRefusedPerAddressLimit
    /// A request's head (or, when `body`, its body) took longer than `--header-timeout`.
    case requestTimedOut(body: Bool)
}

/// The answers an engine writes on its own, before or without asking its application: one
/// catalog, so that every engine words them alike (docs/http-api.md, "Routes": every error is JSON).
public enum EngineAnswers {
    /// The 408 for a request whose head (or, when `body`, body) was not complete within `seconds`
    /// (`--header-timeout`; RFC 9110 §15.5.9: `request_timeout`). The engine writes it itself
    /// (`HTTPResponse.closingMessage`) and closes the connection.
    public static func requestTimeout(seconds: Int, body: Bool) -> HTTPResponse {
        .error(
            408,
            ServiceError(
                "request_timeout",
                "the request \(body ? "body" : "head") was not complete within \(seconds) s (--header-timeout)"))
    }

    /// The 414 for a request target over `limit` bytes (RFC 9110 §15.5.15: `uri_too_long`).
    public static func uriTooLong(limit: Int) -> HTTPResponse {
        .error(414, ServiceError("uri_too_long", "the request target is over \(limit) bytes"))
    }

    /// The 413 for a body over `limit` bytes (docs/http-api.md: `payload_too_large`).
    public static func payloadTooLarge(limit: Int) -> HTTPResponse {
        .error(413, ServiceError("payload_too_large", "the request body is over \(limit) bytes"))
    }

    /// The 400 for a request target whose path holds `%00`, a NUL byte.
    public static let encodedNUL = HTTPResponse.error(
        400, ServiceError("invalid_request", "the request target's path holds %00, a NUL byte"))

    /// The 404 for a path with an encoded slash (`%2F`), which is data, not a separator (RFC 3986
    /// §2.2).
    public static let encodedSlash = HTTPResponse.error(
        404, ServiceError("not_found", "no route for a path with an encoded slash (%2F)"))
}

/// How often the engine calls `HTTPTicks.tick()`, in milliseconds.
public let tickMilliseconds = 50

/// What an application's shutdown (the token service's `Service.shutdown(engine:)`) asks of the
/// HTTP engine that serves it (`MicroHTTPDServer`), in this order, each once, from one thread.
public protocol ServiceEngine: Sendable {
    /// Stops accepting connections (the listening socket closes); open connections are served on.
    func quiesce()
    /// Waits until no request is in flight, streams included, or the engine's grace period (3 s
    /// by default) has passed, saying so in the log then.
    func awaitIdle()
    /// Closes what is left and stops; returns when the engine has stopped.
    func stop()
}
