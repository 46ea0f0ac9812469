import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// What the access handler and the request-completed callback (Callbacks.swift) do, in Swift.

/// Per-request state, owned by libmicrohttpd's `*con_cls` from the first access-handler call until
/// the request-completed callback. Only the connection's polling thread touches it.
final class RequestContext {
    /// Where the request stands: one state instead of a set of flags.
    enum Progress {
        /// Its head passed the responder's checks: the body (if any) is being read.
        case admitted(Responder.AdmittedRequest)
        /// Its head alone decided this answer (404, 405, 401, 414, `OPTIONS`, a framing
        /// refusal): sent once the body (if any) has been read and dropped, or at once.
        case refused(HTTPResponse)
        /// Its body is over the limit: read and dropped, answered 413 at its end.
        case tooLarge
        /// `GET` or `HEAD /token`: answered from the `TokenResponseCache`.
        case tokenRead
        /// A write whose answer is decided later: the connection is suspended until it is.
        case waiting(PendingResponse)
        /// A response is queued (or a stream opened).
        case answered
    }

    let method: String
    let path: String
    let started = ContinuousClock.now
    var progress: Progress = .answered
    /// The route `Responder.admit` matched (kept for the metrics once the request is over).
    var route: Route?
    var body: [UInt8] = []
    /// Body bytes received so far, kept or not.
    var received = 0
    /// Whether the body comes chunked (its connection has a short idle timeout until it is complete).
    let chunked: Bool
    var status = 0
    var bytes = 0
    var stream: EventStream?
    /// The request's `Origin` field value, kept from its head on so that every answer to it, the
    /// engine's own included, gets the same CORS fields (`ResponseHeaders.completing`).
    let origin: String?
    /// The service's CORS policy (`Responder.crossOrigin`).
    let crossOrigin: CrossOriginPolicy

    init(method: String, path: String, chunked: Bool, origin: String?, crossOrigin: CrossOriginPolicy) {
        self.method = method
        self.path = path
        self.chunked = chunked
        self.origin = origin
        self.crossOrigin = crossOrigin
    }
}

/// The request's `If-None-Match` field value, as libmicrohttpd keeps it (no copy).
private func ifNoneMatch(_ connection: OpaquePointer) -> UnsafePointer<CChar>? {
    MHD_lookup_connection_value(connection, .HEADER_KIND, "If-None-Match")
}

/// `SlotMarker.tokenGet` or `.tokenHead` when `method` and `url` (as libmicrohttpd passes them: the
/// path without the query) are a `GET` or `HEAD` of `/token`. `strcmp` on the C strings: no
/// `String` is made.
private func tokenRead(_ method: UnsafePointer<CChar>, _ url: UnsafePointer<CChar>) -> UnsafeMutableRawPointer? {
    guard strcmp(url, "/token") == 0 else { return nil }
    if strcmp(method, "GET") == 0 { return SlotMarker.tokenGet }
    if strcmp(method, "HEAD") == 0 { return SlotMarker.tokenHead }
    return nil
}

/// The access handler (`mhdAccessHandler`). Answers go out in a later call than the first, which
/// keeps the connection alive; the exceptions are a `Content-Length` over the limit and a refused
/// request with a body, answered at once (the body is never read and libmicrohttpd closes the
/// connection).
func handleRequest(
    daemon: DaemonContext, connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
    version: UnsafePointer<CChar>?, uploadData: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>,
    contextSlot: UnsafeMutablePointer<UnsafeMutableRawPointer?>
) -> MHD_Result {
    let server = daemon.server
    let responder = server.responder
    let limit = server.configuration.maxBodyBytes

    let first = contextSlot.pointee
    guard var existing = first, !SlotMarker.isTargetMarker(existing) else {
        // The first call: the header fields have arrived, the body (if any) has not.
        let marker = responder.answersTokenReadsBlindly ? tokenRead(method, url) : nil
        let length = header(connection, "Content-Length").flatMap { UInt64($0) }
        // One pass over the header fields serves the framing checks and tells a chunked body.
        let counts = fpt_count_framing_fields(connection)
        let chunked = counts.transfer_encoding > 0
        let framing = framingRefusal(
            connection, counts: counts, method: method, url: url, version: version,
            budget: server.configuration.headBudget)
        if framing == nil, chunked {
            // A chunked body whose chunk-size line cannot fit in the pool leaves libmicrohttpd
            // unable to advance the connection (see DaemonLoop): a short idle timeout while a
            // chunked body arrives bounds how long such a connection lives. The connection's
            // own timeout is restored once the body is complete.
            _ = fpt_set_connection_timeout(
                connection,
                UInt32(
                    min(
                        server.configuration.idleTimeoutSeconds,
                        chunkedBodyIdleSeconds)))
        }
        // A head that completes past --header-timeout is not carried out: its connection is
        // being closed (RequestDeadline).
        // With CORS on, its 408 (should the body be late) carries the CORS fields for its Origin.
        let expectsBody = chunked || (length ?? 0) > 0
        guard
            daemon.deadlines.headReceived(
                connection, at: .now, bodyExpected: expectsBody,
                origin: expectsBody && responder.crossOrigin.isEnabled ? header(connection, "Origin") : nil)
        else { return .NO }
        server.inFlight.withLock { $0 += 1 }
        if let marker, first == nil, framing == nil, length == nil, !responder.accessLog {
            contextSlot.pointee = marker
            return .YES
        }
        let head = requestHead(connection, method: String(cString: method), path: String(cString: url))
        let context = RequestContext(
            method: head.method, path: head.path, chunked: chunked, origin: head.headers["Origin"],
            crossOrigin: responder.crossOrigin)
        contextSlot.pointee = Unmanaged.passRetained(context).toOpaque()
        if let refusal = targetRefusal(first, path: head.path, limit: server.configuration.maxURLBytes) ?? framing {
            context.route = Route(path: head.path)  // for the metrics' label only: the head is not admitted
            context.progress = .refused(refusal)
        } else {
            switch responder.admit(head) {
            case .answer(let response, let route):
                context.route = route
                context.progress = .refused(response)
            case .proceed(let admitted):
                context.route = admitted.route
                if let length, length > UInt64(limit) {
                    context.progress = .tooLarge
                    return respond(Responder.payloadTooLarge(limit: limit), on: connection, context: context)
                }
                context.progress = marker != nil ? .tokenRead : .admitted(admitted)
            }
        }
        // A refused request with a body is answered now, unread (no 100 Continue; libmicrohttpd
        // then closes the connection), so that an unauthorized client cannot make the service
        // take in bodies. One without a body is answered in the next call, keeping the connection.
        if case .refused(let early) = context.progress,
            (length ?? 0) > 0 || chunked || early.status == 400 || early.status == 417 || early.status == 501
        {
            return respond(early, on: connection, context: context)
        }
        return .YES
    }
    if SlotMarker.isTokenNotModified(existing) { return .YES }  // answered
    if SlotMarker.isTokenRead(existing) {
        // The fast path: answered from the cache in this second call (which keeps the connection
        // alive), a 304 when If-None-Match names the current ETag. A chunked body, the one kind
        // not announced by Content-Length, turns it back into an ordinary request so that its
        // size is checked as for any other.
        if uploadSize.pointee == 0 {
            let queued = server.tokenResponses.queue(
                on: connection, responder: responder,
                ifNoneMatch: ifNoneMatch(connection))
            if queued.status == 304 {
                contextSlot.pointee =
                    existing == SlotMarker.tokenGet
                    ? SlotMarker.tokenGetNotModified
                    : SlotMarker.tokenHeadNotModified
            }
            return queued.result
        }
        let context = RequestContext(
            method: existing == SlotMarker.tokenGet ? "GET" : "HEAD", path: "/token",
            chunked: true,  // the one kind of body this path lets through
            origin: nil, crossOrigin: CrossOriginPolicy())  // taken only with CORS off
        context.progress = .tokenRead
        context.route = .token
        existing = Unmanaged.passRetained(context).toOpaque()
        contextSlot.pointee = existing
    }
    let context = Unmanaged<RequestContext>.fromOpaque(existing).takeUnretainedValue()

    if uploadSize.pointee > 0 {
        let count = uploadSize.pointee
        context.received += count
        uploadSize.pointee = 0
        switch context.progress {
        case .tooLarge:
            // A body over the limit is read and dropped so that its 413 can be sent at its end,
            // but not forever: a chunked body can be endless. Past 1 MiB (or 16 times the limit)
            // the connection is closed without an answer (libmicrohttpd cannot queue one in the
            // middle of a body).
            if context.received > max(1 << 20, 16 * limit) { return .NO }
        case .admitted, .tokenRead:
            guard let uploadData else { break }
            if context.body.count + count > limit {
                context.progress = .tooLarge
                context.body = []
            } else {
                uploadData.withMemoryRebound(to: UInt8.self, capacity: count) {
                    context.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: count))
                }
            }
        case .refused, .waiting, .answered:
            break
        }
        return .YES
    }
    if context.chunked {
        _ = fpt_set_connection_timeout(connection, UInt32(server.configuration.idleTimeoutSeconds))
    }
    // A body that completes past --header-timeout is not carried out (RequestDeadline).
    if context.received > 0 || context.chunked, !daemon.deadlines.bodyReceived(connection) { return .NO }
    switch context.progress {
    case .answered:
        return .YES
    case .refused(let early):
        return respond(early, on: connection, context: context)
    case .tooLarge:
        return respond(Responder.payloadTooLarge(limit: limit), on: connection, context: context)
    case .tokenRead:
        context.body = []
        let queued = server.tokenResponses.queue(
            on: connection, responder: responder,
            ifNoneMatch: ifNoneMatch(connection))
        context.progress = .answered
        context.status = queued.status
        context.bytes = queued.bytes
        return queued.result
    case .waiting(let pending):
        // Resumed: the answer has arrived.
        return answer(pending, on: connection, context: context, daemon: daemon)
    case .admitted(var admitted):
        admitted.request.body = context.body
        context.body = []
        switch responder.respond(to: admitted) {
        case .response(let response):
            return respond(response, on: connection, context: context)
        case .eventStream:
            return openStream(admitted, on: connection, context: context, daemon: daemon)
        case .later(let pending):
            context.progress = .waiting(pending)
            return answer(pending, on: connection, context: context, daemon: daemon)
        }
    }
}

/// Sends `pending`'s response when it is decided; otherwise suspends the connection until it is
/// (libmicrohttpd calls the access handler again once the connection is resumed).
private func answer(
    _ pending: PendingResponse, on connection: OpaquePointer, context: RequestContext,
    daemon: DaemonContext
) -> MHD_Result {
    let handle = ConnectionHandle(pointer: connection, loop: daemon.loop)
    guard
        let response = pending.take(
            orPark: { MHD_suspend_connection(connection) },
            resume: { handle.resume() })
    else { return .YES }
    return respond(response, on: connection, context: context)
}

/// The request-completed callback (`mhdRequestCompleted`): counts the request out, records it
/// (metrics, access log) and releases its context. `slot` is what `*con_cls` held.
func finishRequest(server: MicroHTTPDServer, slot: UnsafeMutableRawPointer, connection: OpaquePointer?) {
    // A target marker still in the slot: libmicrohttpd ended the request (431, a bad
    // Content-Length, a reset, a timeout, shutdown) before the access handler ever ran, so there
    // is no context and nothing was counted in.
    if SlotMarker.isTargetMarker(slot) { return }
    server.inFlight.withLock { $0 -= 1 }
    if SlotMarker.isTokenRead(slot) || SlotMarker.isTokenNotModified(slot) {
        // The fast path keeps no context, so no start time: counted, not timed.
        let get = slot == SlotMarker.tokenGet || slot == SlotMarker.tokenGetNotModified
        server.responder.recordFinished(
            .init(
                method: get ? "GET" : "HEAD", path: "/token", route: .token,
                status: SlotMarker.isTokenNotModified(slot) ? 304 : 200, bytes: 0,
                microseconds: nil, wasStream: false))
        return
    }
    let context = Unmanaged<RequestContext>.fromOpaque(slot).takeRetainedValue()
    let elapsed = ContinuousClock.now - context.started
    let micros = Int(elapsed.components.seconds) * 1_000_000 + Int(elapsed.components.attoseconds / 1_000_000_000_000)
    server.responder.recordFinished(
        .init(
            method: context.method, path: context.path, route: context.route,
            status: context.status,
            bytes: context.stream?.bytesWritten ?? context.bytes, microseconds: micros,
            wasStream: context.stream != nil,
            remote: server.responder.logsPeerAddresses ? peerAddress(of: connection) : nil))
}

/// Queues a complete response (libmicrohttpd copies the body).
func respond(_ response: HTTPResponse, on connection: OpaquePointer, context: RequestContext) -> MHD_Result {
    guard let mhdResponse = makeResponse(response, crossOrigin: context.crossOrigin, origin: context.origin)
    else { return .NO }
    let result = MHD_queue_response(connection, UInt32(response.status), mhdResponse)
    MHD_destroy_response(mhdResponse)
    context.progress = .answered
    context.status = response.status
    context.bytes = response.status == 304 ? 0 : response.body.count  // a 304's body is never sent
    return result
}

/// Adds `headers` to a libmicrohttpd response, with the fields every response carries
/// (`ResponseHeaders.completing(_:crossOrigin:origin:)`: the CORS fields for `origin` under
/// `crossOrigin`, `X-Content-Type-Options`, the default `Cache-Control`). Every answer the engine
/// queues passes through here: the one place its header is completed.
func addHeaders(
    _ headers: HTTPHeaders, to response: OpaquePointer, crossOrigin: CrossOriginPolicy, origin: String?
) {
    for field in ResponseHeaders.completing(headers, crossOrigin: crossOrigin, origin: origin) {
        _ = MHD_add_response_header(response, field.name, field.value)
    }
}

/// The answer to a request whose target `mhdURILog` marked: 414, 400 (`%00`) or 404 (`%2F`).
private func targetRefusal(_ marker: UnsafeMutableRawPointer?, path: String, limit: Int) -> HTTPResponse? {
    switch marker {
    case SlotMarker.uriTooLong:
        Responder.uriTooLong(limit: limit)
    case SlotMarker.encodedNUL:
        .error(400, ServiceError("invalid_request", "the request target's path holds %00, a NUL byte"))
    case SlotMarker.encodedSlash:
        .error(404, ServiceError("not_found", "no route for a path with an encoded slash (%2F)"))
    case SlotMarker.malformedTarget:
        RequestFraming.refusal(
            {
                var facts = RequestFraming.Facts()
                facts.malformedTarget = true
                return facts
            }())
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
/// Also, first: a head over `budget` (431; `RequestHeadBudget`: the answer's header block would
/// not fit beside it in the connection's pool, so the request would be carried out and get no
/// answer at all); a header field name that is empty or holds whitespace (400; RFC 9112 §5.1; it
/// may be a different field to a proxy in front); an HTTP/1.1 request without exactly one `Host`
/// field (RFC 9112 §3.2: 400; libmicrohttpd's own check, `MHD_OPTION_STRICT_FOR_CLIENT`, sends its
/// error page's header block twice in 0.9.75).
private func framingRefusal(
    _ connection: OpaquePointer, counts: fpt_framing_counts, method: UnsafePointer<CChar>,
    url: UnsafePointer<CChar>, version: UnsafePointer<CChar>?, budget: RequestHeadBudget
) -> HTTPResponse? {
    if !budget.admits(
        headBytes: counts.head_bytes, records: Int(counts.records),
        cookieValueBytes: counts.has_cookie != 0 ? counts.cookie_bytes : nil)
    {
        return .error(
            431,
            ServiceError(
                "header_fields_too_large",
                "the request line and header fields are over \(budget.maxHeaderBytes) bytes"
                    + " (each field, query argument and cookie counting 48 more)"))
    }
    // libmicrohttpd parses in place: the method, the target and the version (and the first field's
    // name) lie in its read buffer as they were sent, so the gaps between them are the spaces and
    // line end that it skipped (RequestFraming).
    var facts = RequestFraming.Facts()
    facts.malformedRequestLine = !RequestFraming.requestLineIsWellFormed(
        methodLength: strlen(method), bytesBeforeTarget: method.distance(to: url),
        bytesAfterVersion: version.flatMap { version in
            counts.first_name.map { (version + strlen(version)).distance(to: $0) }
        })
    facts.bareCR = Int(counts.bare_cr)
    facts.isHTTP10 = version.map { strcmp($0, "HTTP/1.0") == 0 } ?? false
    facts.transferEncodings = Int(counts.transfer_encoding)
    facts.unmetExpectations = Int(counts.unmet_expectations)
    if let refusal = RequestFraming.refusal(facts) { return refusal }
    if counts.malformed_names > 0 {
        return .error(400, ServiceError("invalid_request", "a header field name is empty or holds whitespace"))
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
        !value.utf8.contains(where: { $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
    {
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

/// The header fields the responder reads, in the order it may need them.
private let headFields = [
    "Content-Type", "Authorization", "Origin", "Access-Control-Request-Method", "If-None-Match",
    "Last-Event-ID",
]

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

/// `bytes` with every byte but the unreserved ones of RFC 3986 §2.3 written as `%xx` (lowercase
/// hex digits, which RFC 3986 §2.1 makes equivalent to uppercase).
func percentEncoded(_ bytes: UnsafeRawBufferPointer) -> String {
    let digits = DeviceTokenHex.digits
    var encoded: [UInt8] = []
    encoded.reserveCapacity(bytes.count)
    for byte in bytes {
        switch byte {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"),
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
