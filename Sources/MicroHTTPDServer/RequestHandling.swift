import CMicroHTTPD
import ForgePushToken
import HTTPServing
import ServerSupport
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// What the access handler and the request-completed callback (Callbacks.swift) do, in Swift, one
// function per event of a request's life (docs/architecture.md, "The path of a request"):
//
//   handle ─┬─ headArrived ── (cached read: mark the slot) or open ── perform(machine.head)
//           ├─ cachedRead ─── queue the cached response, or open (a chunked body after all)
//           └─ carryOn ────── bodyChunk (machine.bodyChunk) or bodyComplete ── perform(machine.complete)
//   finish ─── record the finished request, release its context
//
// Each step asks the request's `RequestStateMachine` and carries out what it returns (`perform`).

/// The facts of a request's head that the engine reads from libmicrohttpd in the first call.
struct HeadFacts {
    /// One pass over its records (`scanFraming`): the framing counts, the head's size.
    let scan: FramingScan
    /// Its `Content-Length`, or `nil` without one.
    let contentLength: UInt64?
    /// Whether its body comes chunked.
    let chunked: Bool
    /// The answer refusing its framing (`framingRefusal`), or `nil`.
    let framingRefusal: HTTPResponse?

    /// Whether it announces a body.
    var expectsBody: Bool { chunked || (contentLength ?? 0) > 0 }
    /// Whether it asks for `100 Continue`.
    var expectsContinue: Bool { scan.counts.continueExpectations > 0 }
}

extension Daemon {
    /// The access handler: called once with the head (`*con_cls` empty or a flawed target), once
    /// per piece of body, and once more with `*upload_data_size == 0` when the body is complete
    /// (and again after a suspended connection is resumed). Answers go out in a later call than
    /// the first, which keeps the connection alive; the exceptions are a `Content-Length` over the
    /// limit and a refused request with a body, answered at once (the body is never read and
    /// libmicrohttpd closes the connection).
    func handle(_ call: RequestCall) -> MHD_Result {
        // Not a call of ours to answer: libmicrohttpd 0.9.75 calls with its read buffer and no bytes
        // after it has sent `100 Continue` to a request without a body when more bytes are buffered
        // behind it (`process_request_body` in `MHD_CONNECTION_CONTINUE_SENT`), where no answer can
        // be queued: a write answered here was carried out and never answered (issue 21), and one
        // answered in the first call instead closed the connection on the requests pipelined behind
        // it (issue 27 §6). The body's end comes in the next call, with no upload data at all.
        if call.uploadData != nil, call.uploadSize.pointee == 0 { return .YES }
        switch RequestSlot(word: call.slot.pointee) {
        case .empty:
            return headArrived(call, flaw: nil)
        case .flawedTarget(let flaw):
            return headArrived(call, flaw: flaw)
        case .cachedRead(let mark):
            return cachedRead(call, mark)
        case .context(let context):
            return carryOn(call, context)
        }
    }

    /// The first call: the header fields have arrived, the body (if any) has not. Counts the
    /// request in, then marks a cached read in the slot (allocating nothing), or opens a context.
    private func headArrived(_ call: RequestCall, flaw: TargetFlaw?) -> MHD_Result {
        let connection = call.connection
        let configuration = server.configuration
        let mark = cachedReader?.answersCachedReadsBlindly == true ? cachedReadMark(call) : nil
        let facts = readHead(call)
        if facts.framingRefusal == nil, facts.chunked {
            // A chunked body whose chunk-size line cannot fit in the pool leaves libmicrohttpd
            // unable to advance the connection (see DaemonLoop): a short idle timeout while a
            // chunked body arrives bounds how long such a connection lives. The connection's
            // own timeout is restored once the body is complete.
            _ = fpt_set_connection_timeout(
                connection, UInt32(min(configuration.idleTimeoutSeconds, chunkedBodyIdleSeconds)))
        }
        // A head that completes past --header-timeout is not carried out: its connection is
        // being closed (RequestDeadline).
        // With CORS on, its 408 (should the body be late) carries the CORS fields for its Origin.
        let crossOrigin = traits.crossOrigin
        guard
            deadlines.headReceived(
                connection, at: clock.now, bodyExpected: facts.expectsBody,
                origin: facts.expectsBody && crossOrigin.isEnabled
                    ? facts.scan.fields.string(capture.origin, name: "Origin", on: connection) : nil)
        else { return .NO }
        server.inFlight.add(1, ordering: .acquiringAndReleasing)
        // The cached read answers in the second call. Kept off it: a body announced by
        // Content-Length, a refused target or framing, the access log (which needs what only a
        // context keeps), and `100 Continue` (with more bytes buffered behind it, the second call
        // would be one where no answer can be queued; see `handle`).
        if let mark, flaw == nil, facts.framingRefusal == nil, facts.contentLength == nil,
            !traits.recordsEveryRequest, !facts.expectsContinue
        {
            RequestSlot.cachedRead(mark).store(in: call.slot)
            return .YES
        }
        return open(call, facts: facts, flaw: flaw, cachedRead: mark != nil)
    }

    /// A `CachedReadMark` when the request is a `GET` or `HEAD` of the cached read's path
    /// (`HTTPApplicationTraits.cachedReadPath`), compared in place: no `String` is made.
    private func cachedReadMark(_ call: RequestCall) -> CachedReadMark? {
        let matches = cachedReadPath.withUTF8Buffer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { path in
                // A static string's bytes end with a NUL.
                path.baseAddress.map { strcmp(call.url, $0) == 0 } ?? false
            }
        }
        guard matches else { return nil }
        if strcmp(call.method, "GET") == 0 { return CachedReadMark(isHead: false) }
        if strcmp(call.method, "HEAD") == 0 { return CachedReadMark(isHead: true) }
        return nil
    }

    /// Reads the head's framing facts from libmicrohttpd (one pass over its records).
    private func readHead(_ call: RequestCall) -> HeadFacts {
        let scan = scanFraming(call.connection, method: call.method, capture: capture)
        return HeadFacts(
            scan: scan,
            contentLength: scan.fields.string(capture.contentLength, name: "Content-Length", on: call.connection)
                .flatMap { UInt64($0) },
            chunked: scan.counts.transferEncoding > 0,
            framingRefusal: framingRefusal(
                call.connection, scan: scan, method: call.method, url: call.url, version: call.version,
                budget: server.configuration.headBudget))
    }

    /// Asks what the head decided (the engine's refusal of the target or the framing, the
    /// application's admission, or, with `cachedRead`, the cached read), opens the request's
    /// context of the matching kind (`RequestContext.Kind`), stores it in the slot, and tells its
    /// machine. The one place a context is made.
    private func open(_ call: RequestCall, facts: HeadFacts, flaw: TargetFlaw?, cachedRead: Bool) -> MHD_Result {
        let head = requestHead(
            call.connection, method: String(cString: call.method), path: String(cString: call.url),
            fields: traits.headerFieldsRead, parameters: traits.queryParametersRead, scan: facts.scan)
        let method = head.method
        let path = head.path
        // The engine's own answers carry the CORS fields too: `Origin` is read whether or not the
        // application reads it.
        let origin = facts.scan.fields.string(capture.origin, name: "Origin", on: call.connection)
        let limit = server.configuration.maxBodyBytes
        // The request's duration runs from here (read before the admission: read between the
        // admission's payload and the context made from it, the time cost a copy of the payload).
        let started = clock.now
        let context: RequestContext
        let decided: RequestStateMachine.Head
        if let refusal = flaw.flatMap({ targetRefusal($0, limit: maxURLBytes) }) ?? facts.framingRefusal {
            // Not admitted: no label (the application may go by the path).
            context = RequestContext(
                method: method, path: path, chunked: facts.chunked, origin: origin, crossOrigin: traits.crossOrigin,
                limit: limit, started: started)
            decided = .refused(refusal)
        } else {
            switch application.admit(head) {
            case .answer(let response, let label):
                context = labelledType.init(
                    label: label, method: method, path: path, chunked: facts.chunked, origin: origin,
                    crossOrigin: traits.crossOrigin, limit: limit, started: started)
                decided = .refused(response)
            case .proceed(let admitted, let label):
                context = admittedType.init(
                    admitted: admitted, label: label, method: method, path: path, chunked: facts.chunked,
                    origin: origin, crossOrigin: traits.crossOrigin, limit: limit, started: started)
                decided = cachedRead ? .cachedRead : .admitted
            }
        }
        context.headCost = (facts.scan.headBytes, facts.scan.counts.records, facts.scan.counts.cookieValueBytes)
        RequestSlot.context(context).store(in: call.slot)
        return perform(
            context.machine.head(decided, contentLength: facts.contentLength, chunked: facts.chunked), call, context)
    }

    /// The cached read's second call: answered from the cache (which keeps the connection alive),
    /// a 304 when `If-None-Match` names the current `ETag`. A chunked body, the one kind not
    /// announced by `Content-Length`, turns it back into an ordinary request (`open`) so that its
    /// size is checked as for any other.
    private func cachedRead(_ call: RequestCall, _ mark: CachedReadMark) -> MHD_Result {
        guard mark.status == .unanswered else { return .YES }  // answered
        guard call.uploadSize.pointee == 0 else {
            let result = open(call, facts: readHead(call), flaw: nil, cachedRead: true)
            guard case .context(let context) = RequestSlot(word: call.slot.pointee), result == .YES else {
                return result
            }
            return carryOn(call, context)
        }
        guard let cachedReader else { return .NO }  // marked only when there is one
        let queued = server.cachedReads.queue(
            on: call.connection, application: cachedReader, ifNoneMatch: ifNoneMatch(call.connection))
        var answered = mark
        answered.status = queued.status == 304 ? .notModified : .ok
        RequestSlot.cachedRead(answered).store(in: call.slot)
        return queued.result
    }

    /// A later call of an ordinary request: a piece of body, or its end.
    private func carryOn(_ call: RequestCall, _ context: RequestContext) -> MHD_Result {
        let count = call.uploadSize.pointee
        guard count == 0 else {
            call.uploadSize.pointee = 0
            return bodyChunk(call.uploadData, count: count, context)
        }
        return bodyComplete(call, context)
    }

    /// A piece of body of `count` bytes: kept, dropped, or the connection closed, as the machine
    /// says.
    private func bodyChunk(_ data: UnsafePointer<CChar>?, count: Int, _ context: RequestContext) -> MHD_Result {
        switch context.machine.bodyChunk(count: count) {
        case .keep:
            data?.withMemoryRebound(to: UInt8.self, capacity: count) {
                context.body.append(contentsOf: UnsafeBufferPointer(start: $0, count: count))
            }
        case .discardAll:
            context.body = []
        case .drop:
            break
        case .close:
            return .NO
        }
        return .YES
    }

    /// The body is complete (or there was none), or a suspended connection was resumed: its
    /// deadline and trailer checked, the machine's next step carried out.
    private func bodyComplete(_ call: RequestCall, _ context: RequestContext) -> MHD_Result {
        let connection = call.connection
        let configuration = server.configuration
        if context.chunked {
            _ = fpt_set_connection_timeout(connection, UInt32(configuration.idleTimeoutSeconds))
        }
        // A body that completes past --header-timeout is not carried out (RequestDeadline).
        if context.machine.received > 0 || context.chunked, !deadlines.bodyReceived(connection) { return .NO }
        // A chunked body's trailer fields arrive with its end: refused before anything is carried out
        // when the answer would not fit beside them (RequestTrailerCheck).
        if context.chunked, !context.trailerChecked {
            context.trailerChecked = true
            if let refusal = trailerRefusal(connection, headCost: context.headCost, budget: configuration.headBudget) {
                return perform(context.machine.trailerRefused(refusal), call, context)
            }
        }
        return perform(context.machine.complete(), call, context)
    }

    /// Carries out a step of the request's `RequestStateMachine`: the libmicrohttpd calls, and the
    /// application's, whose reply goes back to the machine.
    private func perform(_ step: consuming RequestStateMachine.Step, _ call: RequestCall, _ context: RequestContext)
        -> MHD_Result
    {
        let connection = call.connection
        switch step {
        case .readOn, .none:
            return .YES
        case .queue(let response):
            return respond(response, on: connection, context: context)
        case .queueCachedRead:
            context.body = []
            guard let cachedReader else { return .NO }  // decided only when there is one
            let queued = server.cachedReads.queue(
                on: connection, application: cachedReader, ifNoneMatch: ifNoneMatch(connection))
            context.status = queued.status
            context.bytes = queued.bytes
            return queued.result
        case .respond:
            // The machine says `.respond` only after the head was admitted: `context` is an
            // `AdmittedRequestContext` (`open`).
            let admitted = unsafeDowncast(context, to: Admitted.self).admitted
            let body = context.body
            context.body = []
            let reply = application.respond(to: admitted, body: body)
            return perform(context.machine.replied(reply), call, context)
        case .openStream:
            let admitted = unsafeDowncast(context, to: Admitted.self)
            if detaches(context, version: call.version) {
                return openDetachedStream(admitted, on: connection)
            }
            return openStream(admitted.admitted, on: connection, context: context)
        case .takeOrSuspend(let pending):
            return answer(pending, on: connection, context: context)
        }
    }

    /// Sends `pending`'s response when it is decided; otherwise suspends the connection until it is
    /// (libmicrohttpd calls the access handler again once the connection is resumed).
    private func answer(_ pending: PendingResponse, on connection: OpaquePointer, context: RequestContext)
        -> MHD_Result
    {
        let handle = ConnectionHandle(pointer: connection, loop: loop)
        var parkedNow = false
        guard
            let response = pending.take(
                orPark: {
                    MHD_suspend_connection(connection)
                    parkedNow = true
                },
                resume: { handle.resume() })
        else {
            // Kept where a stopping server finds it (`MicroHTTPDServer.stop()`); once the server
            // has begun to stop, answered at once instead (`PendingResponse.abandon()`, which
            // resumes the connection just suspended).
            if parkedNow {
                context.parked = pending
                if !server.parked.withLock({ $0.park(pending) }) { pending.abandon() }
            }
            return .YES
        }
        if let parked = context.parked {
            context.parked = nil
            server.parked.withLock { $0.unpark(parked) }
        }
        context.machine.sent()
        return respond(response, on: connection, context: context)
    }

    /// The request-completed callback (`mhdRequestCompleted`): counts the request out, records it
    /// (`HTTPApplication.recordFinished`) and releases its context. `slot` is what `*con_cls` held.
    func finish(_ slot: RequestSlot, connection: OpaquePointer?) {
        switch slot {
        case .empty, .flawedTarget:
            // libmicrohttpd ended the request (431, a bad Content-Length, a reset, a timeout,
            // shutdown) before the access handler ever ran: nothing was counted in.
            return
        case .cachedRead(let mark):
            // The cached read keeps no context, so no start time: counted, not timed.
            server.inFlight.subtract(1, ordering: .acquiringAndReleasing)
            application.recordFinished(
                FinishedRequest(
                    method: mark.isHead ? "HEAD" : "GET", path: cachedReadPath.description, status: mark.status.code,
                    bytes: 0, microseconds: nil, wasStream: false),
                label: .unlabelled)
        case .context(let context):
            server.inFlight.subtract(1, ordering: .acquiringAndReleasing)
            if let parked = context.parked {  // closed while it waited (the server stopping)
                context.parked = nil
                server.parked.withLock { $0.unpark(parked) }
            }
            // A handed-over stream ends libmicrohttpd's part with an error completion that is no
            // error: the stream records itself when it ends (`detachedStreamEnded`).
            if context.detached { return }
            let micros = (clock.now - context.started).wholeMicroseconds
            let finished = FinishedRequest(
                method: context.method, path: context.path, status: context.status,
                bytes: context.stream?.bytesWritten ?? context.bytes, microseconds: micros,
                wasStream: context.stream != nil, remote: traits.wantsPeerAddresses ? peerAddress(of: connection) : nil)
            switch context.kind {
            case .engine:
                application.recordFinished(finished, label: .unlabelled)
            case .labelled:
                application.recordFinished(finished, label: unsafeDowncast(context, to: Labelled.self).label)
            case .admitted:
                application.recordFinished(finished, label: unsafeDowncast(context, to: Admitted.self).label)
            }
        }
    }
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
    // `withCString`: the implicit conversion of a `String` argument heap-copies a small string.
    ResponseHeaders.forEachField(of: headers, crossOrigin: crossOrigin, origin: origin) { name, value in
        _ = name.withCString { name in
            value.withCString { value in MHD_add_response_header(response, name, value) }
        }
    }
}

/// The request's `If-None-Match` field value, as libmicrohttpd keeps it (no copy).
func ifNoneMatch(_ connection: OpaquePointer) -> UnsafePointer<CChar>? {
    MHD_lookup_connection_value(connection, .HEADER_KIND, "If-None-Match")
}

/// Seconds a chunked request body may pause before libmicrohttpd closes its connection (the
/// ordinary idle timeout applies again once the body is complete).
let chunkedBodyIdleSeconds = 5
