import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

// libmicrohttpd's callbacks. Each is a module-level, nonisolated function passed as a C function
// pointer; each runs on libmicrohttpd's polling thread. The manual's "microhttpd-cb" section
// describes their contracts.

/// Per-request state, owned by libmicrohttpd's `*con_cls` from the first access-handler call until
/// the request-completed callback. Only the connection's polling thread touches it.
final class RequestContext {
    let method: String
    let path: String
    let started = ContinuousClock.now
    /// `GET` or `HEAD /token`: answered from the `TokenResponseCache`.
    let isTokenRead: Bool
    var body: [UInt8] = []
    /// The request's head: method, target and the header fields the responder reads.
    var head: HTTPRequest
    /// The answer its head alone decided (404, 405, 401, 414, `OPTIONS`): sent once the body (if
    /// any) has been read and dropped.
    var early: HTTPResponse?
    var tooLarge = false
    /// Body bytes received so far, kept or not.
    var received = 0
    /// Whether the body comes chunked (its connection has a short idle timeout until it is complete).
    var chunked = false
    var responded = false
    var status = 0
    var bytes = 0
    var stream: EventStream?

    init(method: String, path: String, isTokenRead: Bool, head: HTTPRequest) {
        self.method = method
        self.path = path
        self.isTokenRead = isTokenRead
        self.head = head
    }
}

/// `*con_cls` of a `GET /token` or `HEAD /token` without a body while the access log is off: a
/// marker instead of a `RequestContext`, so that the commonest request allocates nothing (the
/// completed callback needs nothing from it but to count the request out). The markers are the
/// addresses 1 and 2, which no allocation can have; they are compared, never dereferenced.
private var tokenGetMarker: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 1)! }
private var tokenHeadMarker: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 2)! }

/// Whether `method` and `url` (as libmicrohttpd passes them: the path without the query) are a
/// `GET` or `HEAD` of `/token`. `strcmp` on the C strings: no `String` is made.
private func tokenRead(_ method: UnsafePointer<CChar>, _ url: UnsafePointer<CChar>) -> UnsafeMutableRawPointer? {
    guard strcmp(url, "/token") == 0 else { return nil }
    if strcmp(method, "GET") == 0 { return tokenGetMarker }
    if strcmp(method, "HEAD") == 0 { return tokenHeadMarker }
    return nil
}

/// `MHD_AccessHandlerCallback`. libmicrohttpd calls it once with the headers (`*con_cls` still
/// NULL), once per piece of body, and once more with `*upload_data_size == 0` when the body is
/// complete. Answers go out in a later call than the first, which keeps the connection alive; the
/// exception is a `Content-Length` over the limit, answered 413 at once (the body is never read and
/// libmicrohttpd closes the connection).
func mhdAccessHandler(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?,
    _ method: UnsafePointer<CChar>?, _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
    _ uploadSize: UnsafeMutablePointer<Int>?, _ contextSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
) -> MHD_Result {
    guard let cls, let connection, let url, let method, let uploadSize, let contextSlot else { return .NO }
    let daemon = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue()
    let server = daemon.server
    let limit = server.configuration.maxBodyBytes

    let first = contextSlot.pointee
    guard var existing = first, !isTargetMarker(existing) else {
        // The first call: the header fields have arrived, the body (if any) has not.
        let marker = server.responder.answersTokenReadsBlindly ? tokenRead(method, url) : nil
        let length = header(connection, "Content-Length").flatMap { UInt64($0) }
        // One pass over the header fields serves the framing checks and tells a chunked body.
        let counts = fpt_count_framing_fields(connection)
        let chunked = counts.transfer_encoding > 0
        let framing = framingRefusal(connection, counts: counts, method: method, url: url, version: version,
                                     memoryLimit: server.configuration.connectionMemoryLimit)
        if framing == nil, chunked {
            // A chunked body whose chunk-size line cannot fit in the pool leaves libmicrohttpd
            // unable to advance the connection (see DaemonLoop): a short idle timeout while a
            // chunked body arrives bounds how long such a connection lives. The connection's
            // own timeout is restored once the body is complete.
            _ = fpt_set_connection_timeout(connection, UInt32(min(server.configuration.idleTimeoutSeconds,
                                                                  chunkedBodyIdleSeconds)))
        }
        server.inFlight.withLock { $0 += 1 }
        if let marker, first == nil, framing == nil, length == nil, !server.configuration.accessLog {
            contextSlot.pointee = marker
            return .YES
        }
        let head = requestHead(connection, method: String(cString: method), path: String(cString: url))
        let context = RequestContext(method: head.method, path: head.path, isTokenRead: marker != nil, head: head)
        context.chunked = chunked
        contextSlot.pointee = Unmanaged.passRetained(context).toOpaque()
        let responder = server.responder
        if let refusal = targetRefusal(first, path: head.path, limit: server.configuration.maxURLBytes)
            ?? framing {
            context.early = responder.crossOrigin.decorate(refusal, origin: head.headers["Origin"])
        } else if let early = responder.headResponse(to: head) {
            context.early = responder.crossOrigin.decorate(early, origin: head.headers["Origin"])
        } else if let length, length > UInt64(limit) {
            context.tooLarge = true
            return respond(responder.crossOrigin.decorate(Responder.payloadTooLarge(limit: limit), origin: context.head.headers["Origin"]),
                       on: connection, context: context)
        }
        // A refused request with a body is answered now, unread (no 100 Continue; libmicrohttpd
        // then closes the connection), so that an unauthorized client cannot make the service
        // take in bodies. One without a body is answered in the next call, keeping the connection.
        if let early = context.early,
           (length ?? 0) > 0 || chunked || early.status == 400 || early.status == 501 {
            return respond(early, on: connection, context: context)
        }
        return .YES
    }
    if existing == tokenGetMarker || existing == tokenHeadMarker {
        // The fast path: answered from the cache in this second call (which keeps the connection
        // alive). A chunked body, the one kind not announced by Content-Length, turns it back into
        // an ordinary request so that its size is checked as for any other.
        if uploadSize.pointee == 0 {
            return server.tokenResponses.queue(on: connection, service: server.responder.service).result
        }
        let method = existing == tokenGetMarker ? "GET" : "HEAD"
        let context = RequestContext(method: method, path: "/token", isTokenRead: true,
                                     head: HTTPRequest(method: method, target: "/token"))
        context.chunked = true  // the one kind of body this path lets through
        existing = Unmanaged.passRetained(context).toOpaque()
        contextSlot.pointee = existing
    }
    let context = Unmanaged<RequestContext>.fromOpaque(existing).takeUnretainedValue()

    if uploadSize.pointee > 0 {
        let count = uploadSize.pointee
        context.received += count
        // A body over the limit is read and dropped so that its 413 can be sent at its end, but
        // not forever: a chunked body can be endless. Past 1 MiB (or 16 times the limit) the connection is
        // closed without an answer (libmicrohttpd cannot queue one in the middle of a body).
        if context.tooLarge && context.received > max(1 << 20, 16 * limit) { return .NO }
        if !context.tooLarge, context.early == nil, let uploadData {
            if context.body.count + count > limit {
                context.tooLarge = true
                context.body = []
            } else {
                uploadData.withMemoryRebound(to: UInt8.self, capacity: count) {
                    context.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: count))
                }
            }
        }
        uploadSize.pointee = 0
        return .YES
    }
    if context.chunked {
        _ = fpt_set_connection_timeout(connection, UInt32(server.configuration.idleTimeoutSeconds))
    }
    if context.responded { return .YES }
    if let early = context.early {
        return respond(early, on: connection, context: context)
    }
    if context.tooLarge {
        return respond(server.responder.crossOrigin.decorate(Responder.payloadTooLarge(limit: limit), origin: context.head.headers["Origin"]),
                       on: connection, context: context)
    }
    if context.isTokenRead {
        context.body = []
        let (result, bytes) = server.tokenResponses.queue(on: connection, service: server.responder.service)
        context.responded = true
        context.status = 200
        context.bytes = bytes
        return result
    }

    var request = context.head
    request.body = context.body
    context.body = []
    switch server.responder.respond(to: request) {
    case .response(let response):
        return respond(response, on: connection, context: context)
    case .eventStream:
        return openStream(on: connection, context: context, daemon: daemon)
    }
}

/// `MHD_RequestCompletedCallback`: the request is over (answered, or its connection closed).
/// Writes the access-log line and releases the request's context.
func mhdRequestCompleted(
    _ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
    _ contextSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>?, _ code: MHD_RequestTerminationCode
) {
    guard let cls, let contextSlot, let raw = contextSlot.pointee else { return }
    contextSlot.pointee = nil
    // A target marker still in the slot: libmicrohttpd ended the request (431, a bad
    // Content-Length, a reset, a timeout, shutdown) before the access handler ever ran, so there
    // is no context and nothing was counted in.
    if isTargetMarker(raw) { return }
    let server = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue().server
    if raw == tokenGetMarker || raw == tokenHeadMarker {
        server.inFlight.withLock { $0 -= 1 }
        // The fast path keeps no context, so no start time: counted, not timed.
        server.responder.metrics.recordRequest(path: Route.token.rawValue, method: raw == tokenGetMarker ? "GET" : "HEAD",
                                               status: 200, seconds: nil)
        return
    }
    let context = Unmanaged<RequestContext>.fromOpaque(raw).takeRetainedValue()
    server.inFlight.withLock { $0 -= 1 }
    let elapsed = ContinuousClock.now - context.started
    server.responder.metrics.recordRequest(
        path: context.path, method: context.method, status: context.status,
        seconds: context.stream == nil ? Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18 : nil)
    guard server.configuration.accessLog else { return }
    let micros = elapsed.components.seconds * 1_000_000 + elapsed.components.attoseconds / 1_000_000_000_000
    let bytes = context.stream?.bytesWritten ?? context.bytes
    server.log.access(method: context.method, path: context.path, status: context.status == 0 ? nil : context.status,
                      bytes: bytes, durationMicros: Int64(micros), remote: peerAddress(of: connection))
}

/// Queues a complete response (libmicrohttpd copies the body).
func respond(_ response: HTTPResponse, on connection: OpaquePointer, context: RequestContext) -> MHD_Result {
    guard let mhdResponse = makeResponse(response) else { return .NO }
    let result = MHD_queue_response(connection, UInt32(response.status), mhdResponse)
    MHD_destroy_response(mhdResponse)
    context.responded = true
    context.status = response.status
    context.bytes = response.body.count
    return result
}

func addHeaders(_ headers: HTTPHeaders, to response: OpaquePointer) {
    for field in headers {
        _ = MHD_add_response_header(response, field.name, field.value)
    }
}

/// The answer to a request whose target `mhdURILog` marked: 414, 400 (`%00`) or 404 (`%2F`).
private func targetRefusal(_ marker: UnsafeMutableRawPointer?, path: String, limit: Int) -> HTTPResponse? {
    switch marker {
    case uriTooLongMarker:
        Responder.uriTooLong(limit: limit)
    case encodedNULMarker:
        .error(400, ServiceError("invalid_request", "the request target's path holds %00, a NUL byte"))
    case encodedSlashMarker:
        .error(404, ServiceError("not_found", "no route for a path with an encoded slash (%2F)"))
    default:
        nil
    }
}

/// The answer to a request whose body framing is ambiguous (RFC 9112 §6.1, §6.3), which must not
/// be carried out lest the rest of the connection be read as another request (request smuggling):
/// more than one `Content-Length` (libmicrohttpd reads the first), both `Transfer-Encoding` and
/// `Content-Length` (400), or a transfer coding other than `chunked` (501). Sent at once, so that
/// libmicrohttpd closes the connection.
///
/// Also: a header field name that is empty or holds whitespace (400; RFC 9112 §5.1; it may be a
/// different field to a proxy in front); a request line and fields
/// that leave less than `responseHeaderReserve` bytes of the pool (431); an HTTP/1.1 request
/// without exactly one `Host` field (RFC 9112 §3.2: 400; libmicrohttpd's own check,
/// `MHD_OPTION_STRICT_FOR_CLIENT`, sends its error page's header block twice in 0.9.75).
private func framingRefusal(_ connection: OpaquePointer, counts: fpt_framing_counts,
                            method: UnsafePointer<CChar>, url: UnsafePointer<CChar>,
                            version: UnsafePointer<CChar>?, memoryLimit: Int) -> HTTPResponse? {
    if counts.malformed_names > 0 {
        return .error(400, ServiceError("invalid_request", "a header field name is empty or holds whitespace"))
    }
    // The answer's header block is written into the same pool as the request's: a request that
    // leaves too little room would be carried out and then get no answer at all.
    let requestBytes = counts.bytes + strlen(method) + strlen(url) + 16
    if requestBytes > memoryLimit - responseHeaderReserve {
        return .error(431, ServiceError("header_fields_too_large",
                                        "the request line and header fields are over \(memoryLimit - responseHeaderReserve) bytes"))
    }
    if counts.host != 1, let version, strcmp(version, "HTTP/1.1") == 0 {
        return .error(400, ServiceError("invalid_request", "an HTTP/1.1 request needs exactly one Host field"))
    }
    if counts.content_length > 1 {
        return .error(400, ServiceError("invalid_request", "more than one Content-Length field"))
    }
    if counts.authorization > 1 {
        return .error(400, ServiceError("invalid_request", "more than one Authorization field"))
    }
    // libmicrohttpd answers a non-numeric Content-Length itself, but takes an empty one (as an
    // obs-fold "Content-Length:\r\n 62" arrives) as no body at all: the body would then be read
    // as the next request.
    if counts.content_length == 1, let value = header(connection, "Content-Length"),
       !value.utf8.contains(where: { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
        return .error(400, ServiceError("invalid_request", "the Content-Length field has no number"))
    }
    guard counts.transfer_encoding > 0 else { return nil }
    if counts.content_length > 0 {
        return .error(400, ServiceError("invalid_request", "both Transfer-Encoding and Content-Length"))
    }
    // Exactly "chunked", as libmicrohttpd matches it: with a trailing space it would not take the
    // body as chunked, and the connection would wait for a body it never reads.
    if counts.transfer_encoding > 1 || header(connection, "Transfer-Encoding")?.lowercased() != "chunked" {
        return .error(501, ServiceError("not_implemented", "the only transfer coding accepted is chunked"))
    }
    return nil
}

/// Seconds a chunked request body may pause before libmicrohttpd closes its connection (the
/// ordinary idle timeout applies again once the body is complete).
let chunkedBodyIdleSeconds = 5

/// Bytes of a connection's memory pool kept for the answer's header block: a request whose line
/// and header fields leave less gets 431 from the service before anything is carried out.
let responseHeaderReserve = 1024

/// The header fields the responder reads, in the order it may need them.
private let headFields = ["Content-Type", "Authorization", "Origin", "Access-Control-Request-Method"]

/// The head of a request as the responder sees it: `method`, `path` (libmicrohttpd has split off
/// the query), the header fields the responder reads, and as the query the `access_token`
/// parameter alone (re-encoded from libmicrohttpd's decoded value), as no other one matters.
func requestHead(_ connection: OpaquePointer, method: String, path: String) -> HTTPRequest {
    var headers = HTTPHeaders()
    for name in headFields {
        if let value = header(connection, name) { headers.add(name, value) }
    }
    var query: String?
    if let token = MHD_lookup_connection_value(connection, .GET_ARGUMENT_KIND, "access_token") {
        query = "access_token=" + percentEncoded(UnsafeRawBufferPointer(start: token, count: strlen(token)))
    }
    // libmicrohttpd has decoded the path: a "?" in it came from %3F and is part of the path.
    return HTTPRequest(method: method, path: path, query: query, headers: headers)
}

/// `bytes` with every byte but the unreserved ones of RFC 3986 §2.3 written as `%XX`.
func percentEncoded(_ bytes: UnsafeRawBufferPointer) -> String {
    let digits = Array("0123456789ABCDEF".utf8)
    var encoded: [UInt8] = []
    encoded.reserveCapacity(bytes.count)
    for byte in bytes {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
             UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"):
            encoded.append(byte)
        default:
            encoded += [UInt8(ascii: "%"), digits[Int(byte >> 4)], digits[Int(byte & 0xF)]]
        }
    }
    return String(decoding: encoded, as: UTF8.self)
}

/// The value of request header `name`, or `nil`.
func header(_ connection: OpaquePointer, _ name: String) -> String? {
    MHD_lookup_connection_value(connection, .HEADER_KIND, name).map { String(cString: $0) }
}
