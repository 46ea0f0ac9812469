import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// What the access handler and the request-completed callback (Callbacks.swift) do, in Swift.

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

    // Not a call of ours to answer: libmicrohttpd 0.9.75 calls with its read buffer and no bytes
    // after it has sent `100 Continue` to a request without a body when more bytes are buffered
    // behind it (`process_request_body` in `MHD_CONNECTION_CONTINUE_SENT`), where no answer can
    // be queued: a write answered here was carried out and never answered (issue 21), and one
    // answered in the first call instead closed the connection on the requests pipelined behind
    // it (issue 27 §6). The body's end comes in the next call, with no upload data at all.
    if uploadData != nil, uploadSize.pointee == 0 { return .YES }

    let existing: UnsafeMutableRawPointer
    switch RequestSlot(contextSlot.pointee) {
    case .firstCall(let target):
        // The first call: the header fields have arrived, the body (if any) has not.
        let marker = responder.answersTokenReadsBlindly ? tokenRead(method, url) : nil
        let length = header(connection, "Content-Length").flatMap { UInt64($0) }
        // One pass over the header fields serves the framing checks and tells a chunked body.
        let scan = scanFraming(connection, method: method)
        let chunked = scan.counts.transferEncoding > 0
        // Asks for `100 Continue`: kept off the `GET /token` fast path, which answers in the
        // second call (with `100 Continue` and more bytes buffered, one where no answer can be
        // queued; see below).
        let expectsContinue = scan.counts.continueExpectations > 0
        let framing = framingRefusal(
            connection, scan: scan, method: method, url: url, version: version,
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
        if let marker, target == nil, framing == nil, length == nil, !responder.accessLog, !expectsContinue {
            contextSlot.pointee = marker
            return .YES
        }
        let head = requestHead(connection, method: String(cString: method), path: String(cString: url))
        let context = RequestContext(
            method: head.method, path: head.path, chunked: chunked, origin: head.headers["Origin"],
            crossOrigin: responder.crossOrigin, limit: limit)
        context.headCost = (scan.headBytes, scan.counts.records, scan.counts.cookieValueBytes)
        contextSlot.pointee = Unmanaged.passRetained(context).toOpaque()
        let decided: RequestStateMachine.Head
        if let refusal = targetRefusal(target, path: head.path, limit: server.configuration.maxURLBytes) ?? framing {
            context.route = Route(path: head.path)  // for the metrics' label only: the head is not admitted
            decided = .refused(refusal)
        } else {
            switch responder.admit(head) {
            case .answer(let response, let route):
                context.route = route
                decided = .refused(response)
            case .proceed(let admitted):
                context.route = admitted.route
                decided = marker != nil ? .tokenRead : .admitted(admitted)
            }
        }
        return perform(
            context.machine.head(decided, contentLength: length, chunked: chunked),
            on: connection, context: context, daemon: daemon)
    case .tokenRead(_, notModified: true):
        return .YES  // answered
    case .tokenRead(let isHead, notModified: false):
        // The fast path: answered from the cache in this second call (which keeps the connection
        // alive), a 304 when If-None-Match names the current ETag. A chunked body, the one kind
        // not announced by Content-Length, turns it back into an ordinary request so that its
        // size is checked as for any other.
        if uploadSize.pointee == 0 {
            let queued = server.tokenResponses.queue(
                on: connection, responder: responder,
                ifNoneMatch: ifNoneMatch(connection))
            if queued.status == 304 {
                contextSlot.pointee = RequestSlot.tokenReadMarker(isHead: isHead, notModified: true)
            }
            return queued.result
        }
        let context = RequestContext(
            method: isHead ? "HEAD" : "GET", path: "/token",
            chunked: true,  // the one kind of body this path lets through
            origin: nil, crossOrigin: CrossOriginPolicy(),  // taken only with CORS off
            limit: limit)
        _ = context.machine.head(.tokenRead, contentLength: nil, chunked: true)
        context.route = .token
        existing = Unmanaged.passRetained(context).toOpaque()
        contextSlot.pointee = existing
    case .context(let raw):
        existing = raw
    }
    let context = Unmanaged<RequestContext>.fromOpaque(existing).takeUnretainedValue()

    if uploadSize.pointee > 0 {
        let count = uploadSize.pointee
        uploadSize.pointee = 0
        switch context.machine.bodyChunk(count: count) {
        case .keep:
            uploadData?.withMemoryRebound(to: UInt8.self, capacity: count) {
                context.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: count))
            }
        case .discardAll:
            context.body = []
        case .close:
            return .NO
        default:
            break
        }
        return .YES
    }
    if context.chunked {
        _ = fpt_set_connection_timeout(connection, UInt32(server.configuration.idleTimeoutSeconds))
    }
    // A body that completes past --header-timeout is not carried out (RequestDeadline).
    if context.machine.received > 0 || context.chunked, !daemon.deadlines.bodyReceived(connection) { return .NO }
    // A chunked body's trailer fields arrive with its end: refused before anything is carried out
    // when the answer would not fit beside them (RequestTrailerCheck).
    if context.chunked, !context.trailerChecked {
        context.trailerChecked = true
        if let refusal = trailerRefusal(connection, headCost: context.headCost, budget: server.configuration.headBudget)
        {
            return perform(context.machine.trailerRefused(refusal), on: connection, context: context, daemon: daemon)
        }
    }
    return perform(context.machine.complete(), on: connection, context: context, daemon: daemon)
}

/// Carries out what the request's `RequestStateMachine` decided: the libmicrohttpd calls, and the
/// responder's, whose reply goes back to the machine.
private func perform(
    _ action: RequestStateMachine.Action, on connection: OpaquePointer, context: RequestContext,
    daemon: DaemonContext
) -> MHD_Result {
    switch action {
    case .readOn, .none, .keep, .drop, .discardAll:
        return .YES
    case .close:
        return .NO
    case .queue(let response):
        return respond(response, on: connection, context: context)
    case .queueTokenRead:
        context.body = []
        let queued = daemon.server.tokenResponses.queue(
            on: connection, responder: daemon.server.responder, ifNoneMatch: ifNoneMatch(connection))
        context.status = queued.status
        context.bytes = queued.bytes
        return queued.result
    case .respond(var admitted):
        admitted.request.body = context.body
        context.body = []
        let reply = daemon.server.responder.respond(to: admitted)
        return perform(context.machine.replied(reply), on: connection, context: context, daemon: daemon)
    case .openStream(let admitted):
        return openStream(admitted, on: connection, context: context, daemon: daemon)
    case .takeOrSuspend(let pending):
        return answer(pending, on: connection, context: context, daemon: daemon)
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
    context.machine.sent()
    return respond(response, on: connection, context: context)
}

/// The request-completed callback (`mhdRequestCompleted`): counts the request out, records it
/// (metrics, access log) and releases its context. `slot` is what `*con_cls` held.
func finishRequest(server: MicroHTTPDServer, slot: UnsafeMutableRawPointer, connection: OpaquePointer?) {
    let raw: UnsafeMutableRawPointer
    switch RequestSlot(slot) {
    case .firstCall:
        // A target marker still in the slot: libmicrohttpd ended the request (431, a bad
        // Content-Length, a reset, a timeout, shutdown) before the access handler ever ran, so
        // there is no context and nothing was counted in.
        return
    case .tokenRead(let isHead, let notModified):
        // The fast path keeps no context, so no start time: counted, not timed.
        server.inFlight.withLock { $0 -= 1 }
        server.responder.recordFinished(
            .init(
                method: isHead ? "HEAD" : "GET", path: "/token", route: .token,
                status: notModified ? 304 : 200, bytes: 0, microseconds: nil, wasStream: false))
        return
    case .context(let context):
        raw = context
    }
    server.inFlight.withLock { $0 -= 1 }
    let context = Unmanaged<RequestContext>.fromOpaque(raw).takeRetainedValue()
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

/// Seconds a chunked request body may pause before libmicrohttpd closes its connection (the
/// ordinary idle timeout applies again once the body is complete).
let chunkedBodyIdleSeconds = 5
