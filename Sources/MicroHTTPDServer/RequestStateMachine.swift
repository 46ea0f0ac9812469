import HTTPServing

/// The progress of one request through the engine, as a value, as swift-nio's
/// `HTTPServerPipelineHandler` keeps its pipeline's state: the engine feeds it events (the head has
/// arrived, a piece of body, the body is complete or the connection was resumed, the application
/// replied) and carries out what it returns. It makes no call itself, so every path is tested as
/// plain values (RequestStateMachineTests), without sockets.
///
/// Two kinds of answer, kept apart so that each `switch` over them is exhaustive without a
/// `default:`: a piece of body gets a `BodyVerdict` (keep it, drop it, forget what was kept, or
/// close), every other event a `Step` of the request's life (read on, queue a response, answer
/// from the cache, ask the application, open a stream, take or wait for a later answer).
///
/// The body's bytes stay with the engine (the machine only counts them).
///
/// The application's admitted request (`HTTPApplication.Admitted`) is kept beside it, in the
/// request's `AdmittedRequestContext`, not in it: the engine's code is not specialised for its
/// application, and a machine generic over that type looked up its generic metadata at every
/// step (about 7,000 instructions a `POST /register`, docs/performance.md). A value type. One
/// request's machine is used by its connection's thread only.
struct RequestStateMachine {
    /// Where the request stands.
    enum State {
        /// The head has not been seen yet.
        case idle
        /// Its head passed the application's checks: the body (if any) is being read.
        case admitted
        /// Its head alone decided this answer (404, 405, 401, 414, `OPTIONS`, a framing
        /// refusal): sent once the body (if any) has been read and dropped, or at once.
        case refused(HTTPResponse)
        /// Its body is over the limit: read and dropped, answered 413 at its end.
        case tooLarge
        /// The cached read (`HTTPApplicationTraits.cachedReadPath`): answered from the engine's cache.
        case cachedRead
        /// The application is asked (`.respond`): its reply comes back as `replied(_:)`.
        case responding
        /// A write whose answer is decided later: the connection is suspended until it is.
        case waiting(PendingResponse)
        /// A response is queued (or a stream opened).
        case answered
    }

    /// What the head decided, before any body.
    enum Head {
        /// This answer, whatever the body (`HTTPApplication.admit`'s `.answer`, or the engine's
        /// own refusal of the target or the framing).
        case refused(HTTPResponse)
        /// Read the body and ask the application.
        case admitted
        /// A `GET` or `HEAD` of the cached read's path that the engine answers from its cache
        /// (`HTTPCachedReads.answersCachedReadsBlindly`).
        case cachedRead
    }

    /// What to do with one piece of body.
    enum BodyVerdict: Equatable {
        /// Append it to what is kept.
        case keep
        /// Drop it.
        case drop
        /// The body went over the limit with it: forget what was kept, and drop it.
        case discardAll
        /// Close the connection without an answer (an over-limit body past `dropLimit`).
        case close
    }

    /// The next step of the request's life.
    enum Step {
        /// Nothing to send yet: return and let libmicrohttpd call again (with body, or at its end).
        case readOn
        /// Queue this response.
        case queue(HTTPResponse)
        /// Queue the cached read's response (or its 304).
        case queueCachedRead
        /// Ask the application (`HTTPApplication.respond(to:body:)`) with the admitted request and
        /// the body kept, and pass its reply to `replied(_:)`.
        case respond
        /// Open the event stream (`HTTPApplication.openStream(for:wake:)`).
        case openStream
        /// Take the pending answer and queue it, or suspend the connection until it is decided
        /// (`PendingResponse.take(orPark:resume:)`); the resumed call is `complete()` again.
        case takeOrSuspend(PendingResponse)
        /// Already answered: nothing more.
        case none
    }

    /// The largest body kept, in bytes (`--max-body-bytes`).
    let limit: Int
    /// Where the request stands.
    private(set) var state: State = .idle
    /// Body bytes received so far, kept or not.
    private(set) var received = 0
    /// Body bytes kept.
    private(set) var kept = 0

    /// Bytes of an over-limit body read and dropped (for its 413 at the end) before the
    /// connection is closed instead: 1 MiB, or 16 times the limit. A chunked body can be endless,
    /// and libmicrohttpd cannot queue an answer in the middle of one.
    var dropLimit: Int { max(1 << 20, 16 * limit) }

    /// A request not seen yet, whose body may be at most `limit` bytes.
    init(limit: Int) {
        self.limit = limit
    }

    /// The head has arrived: what it decided, its `Content-Length` (`nil` without one), and
    /// whether its body is chunked.
    /// - Returns: `.queue` to answer at once: a `Content-Length` over the limit (413), or a
    ///   refusal of a request with a body (unread: no `100 Continue`, and libmicrohttpd then closes
    ///   the connection, so that a refused client cannot make the service take in bodies) or of a
    ///   framing error (400, 417, 501); otherwise `.readOn` (a refusal without a body is answered
    ///   in the next call, which keeps the connection). A request without a body that asks for
    ///   `100 Continue` is no exception: libmicrohttpd sends it a `100 Continue`, and the engine
    ///   answers it at the end as any other (it ignores the extra call libmicrohttpd makes when more
    ///   bytes are buffered behind it, where no answer can be queued: RequestHandling.swift), so
    ///   the connection stays open for the requests behind it (issue 27 §6).
    mutating func head(_ head: consuming Head, contentLength: UInt64?, chunked: Bool) -> Step {
        switch head {
        case .refused(let response):
            let status = response.status
            if (contentLength ?? 0) > 0 || chunked || status == 400 || status == 417 || status == 501 {
                state = .answered
                return .queue(response)
            }
            state = .refused(response)
            return .readOn
        case .admitted:
            if let refusal = tooLarge(contentLength) { return refusal }
            state = .admitted
            return .readOn
        case .cachedRead:
            if let refusal = tooLarge(contentLength) { return refusal }
            state = .cachedRead
            return .readOn
        }
    }

    /// The 413 for a `Content-Length` over the limit, or `nil`.
    private mutating func tooLarge(_ contentLength: UInt64?) -> Step? {
        guard let contentLength, contentLength > UInt64(limit) else { return nil }
        state = .answered
        return .queue(EngineAnswers.payloadTooLarge(limit: limit))
    }

    /// A piece of body of `count` bytes has arrived.
    /// - Returns: `.keep`, `.drop`, `.discardAll` (this piece took it over the limit: it is
    ///   answered 413 at its end), or `.close` (an over-limit body past `dropLimit`).
    mutating func bodyChunk(count: Int) -> BodyVerdict {
        received += count
        switch state {
        case .tooLarge:
            return received > dropLimit ? .close : .drop
        case .admitted, .cachedRead:
            if kept + count > limit {
                state = .tooLarge
                kept = 0
                return .discardAll
            }
            kept += count
            return .keep
        case .idle, .refused, .responding, .waiting, .answered:
            return .drop
        }
    }

    /// The body is complete (or there was none), or a suspended connection was resumed.
    /// - Returns: `.queue` (a refusal, or the 413), `.queueCachedRead`, `.respond` (then call
    ///   `replied(_:)`), `.takeOrSuspend` (resumed while waiting), or `.none` once answered.
    mutating func complete() -> Step {
        switch state {
        case .idle, .answered, .responding:
            return .none
        case .refused(let response):
            state = .answered
            return .queue(response)
        case .tooLarge:
            state = .answered
            return .queue(EngineAnswers.payloadTooLarge(limit: limit))
        case .cachedRead:
            state = .answered
            return .queueCachedRead
        case .waiting(let pending):
            return .takeOrSuspend(pending)
        case .admitted:
            state = .responding
            return .respond
        }
    }

    /// The body is complete, and its trailer fields (after a chunked body) are refused with
    /// `response` (RequestTrailerCheck.swift: too large for the answer to fit beside them, or
    /// folded). A request not yet answered is answered `response` instead of being carried out,
    /// whatever its head decided; one already answered, or waiting for its answer, goes on as
    /// `complete()` says.
    /// - Returns: `.queue(response)`, or what `complete()` returns.
    mutating func trailerRefused(_ response: HTTPResponse) -> Step {
        switch state {
        case .admitted, .cachedRead, .refused, .tooLarge:
            state = .answered
            return .queue(response)
        case .idle, .answered, .responding, .waiting:
            return complete()
        }
    }

    /// The application replied `reply` to `.respond`.
    /// - Returns: `.queue`, `.openStream`, or `.takeOrSuspend` for an answer decided later;
    ///   `.none` when no reply was asked for.
    mutating func replied(_ reply: HTTPReply) -> Step {
        guard case .responding = state else { return .none }
        switch reply {
        case .response(let response):
            state = .answered
            return .queue(response)
        case .eventStream:
            state = .answered
            return .openStream
        case .later(let pending):
            state = .waiting(pending)
            return .takeOrSuspend(pending)
        }
    }

    /// A pending answer was taken and queued (after `.takeOrSuspend`), or a stream opened.
    mutating func sent() {
        state = .answered
    }
}
