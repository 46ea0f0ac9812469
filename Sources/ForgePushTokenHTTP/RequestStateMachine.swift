/// The progress of one request through the engine, as a value, in the swift-nio style: the engine
/// feeds it events (the head has arrived, a piece of body, the body is complete or the connection
/// was resumed, the responder replied) and carries out the actions it returns (read on, keep or
/// drop a piece of body, queue a response, answer `GET /token` from the cache, ask the responder,
/// open an event stream, take a pending answer or suspend until it comes, close). It makes no
/// call itself, so every path is tested as plain values (RequestStateMachineTests), without
/// sockets.
///
/// The body's bytes stay with the engine (the machine only counts them): `.keep` means append
/// this piece, `.discardAll` means forget what was kept.
///
/// A value type; `Sendable`. One request's machine is used by its connection's thread only.
public struct RequestStateMachine: Sendable {
    /// Where the request stands.
    public enum State: Sendable {
        /// The head has not been seen yet.
        case idle
        /// Its head passed the responder's checks: the body (if any) is being read.
        case admitted(Responder.AdmittedRequest)
        /// Its head alone decided this answer (404, 405, 401, 414, `OPTIONS`, a framing
        /// refusal): sent once the body (if any) has been read and dropped, or at once.
        case refused(HTTPResponse)
        /// Its body is over the limit: read and dropped, answered 413 at its end.
        case tooLarge
        /// `GET` or `HEAD /token`: answered from the engine's cached response.
        case tokenRead
        /// The responder is asked (`.respond`): its reply comes back as `replied(_:)`.
        case responding(Responder.AdmittedRequest)
        /// A write whose answer is decided later: the connection is suspended until it is.
        case waiting(PendingResponse)
        /// A response is queued (or a stream opened).
        case answered
    }

    /// What the head decided, before any body.
    public enum Head: Sendable {
        /// This answer, whatever the body (`Responder.admit`'s `.answer`, or the engine's own
        /// refusal of the target or the framing).
        case refused(HTTPResponse)
        /// Read the body and ask the responder.
        case admitted(Responder.AdmittedRequest)
        /// A `GET` or `HEAD /token` that the engine answers from its cache
        /// (`Responder.answersTokenReadsBlindly`).
        case tokenRead
    }

    /// What the engine does next.
    public enum Action: Sendable {
        /// Nothing to send yet: return and let libmicrohttpd call again (with body, or at its end).
        case readOn
        /// Append this piece of body to what is kept.
        case keep
        /// Drop this piece of body.
        case drop
        /// The body went over the limit with this piece: forget what was kept, drop this piece.
        case discardAll
        /// Queue this response.
        case queue(HTTPResponse)
        /// Queue the cached `GET /token` response (or its 304).
        case queueTokenRead
        /// Ask the responder (`Responder.respond(to:)`) with the body kept, and pass its reply to
        /// `replied(_:)`.
        case respond(Responder.AdmittedRequest)
        /// Open the event stream (`Responder.openEventStream(for:wake:)`).
        case openStream(Responder.AdmittedRequest)
        /// Take the pending answer and queue it, or suspend the connection until it is decided
        /// (`PendingResponse.take(orPark:resume:)`); the resumed call is `complete()` again.
        case takeOrSuspend(PendingResponse)
        /// Close the connection without an answer.
        case close
        /// Already answered: nothing more.
        case none
    }

    /// The largest body kept, in bytes (`--max-body-bytes`).
    public let limit: Int
    /// Where the request stands.
    public private(set) var state: State = .idle
    /// Body bytes received so far, kept or not.
    public private(set) var received = 0
    /// Body bytes kept.
    public private(set) var kept = 0

    /// Bytes of an over-limit body read and dropped (for its 413 at the end) before the
    /// connection is closed instead: 1 MiB, or 16 times the limit. A chunked body can be endless,
    /// and libmicrohttpd cannot queue an answer in the middle of one.
    public var dropLimit: Int { max(1 << 20, 16 * limit) }

    /// A request not seen yet, whose body may be at most `limit` bytes.
    public init(limit: Int) {
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
    public mutating func head(_ head: Head, contentLength: UInt64?, chunked: Bool) -> Action {
        switch head {
        case .refused(let response):
            let status = response.status
            if (contentLength ?? 0) > 0 || chunked || status == 400 || status == 417 || status == 501 {
                state = .answered
                return .queue(response)
            }
            state = .refused(response)
            return .readOn
        case .admitted, .tokenRead:
            if let contentLength, contentLength > UInt64(limit) {
                state = .answered
                return .queue(Responder.payloadTooLarge(limit: limit))
            }
            if case .admitted(let admitted) = head {
                state = .admitted(admitted)
            } else {
                state = .tokenRead
            }
            return .readOn
        }
    }

    /// A piece of body of `count` bytes has arrived.
    /// - Returns: `.keep`, `.drop`, `.discardAll` (this piece took it over the limit: it is
    ///   answered 413 at its end), or `.close` (an over-limit body past `dropLimit`).
    public mutating func bodyChunk(count: Int) -> Action {
        received += count
        switch state {
        case .tooLarge:
            return received > dropLimit ? .close : .drop
        case .admitted, .tokenRead:
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
    /// - Returns: `.queue` (a refusal, or the 413), `.queueTokenRead`, `.respond` (then call
    ///   `replied(_:)`), `.takeOrSuspend` (resumed while waiting), or `.none` once answered.
    public mutating func complete() -> Action {
        switch state {
        case .idle, .answered, .responding:
            return .none
        case .refused(let response):
            state = .answered
            return .queue(response)
        case .tooLarge:
            state = .answered
            return .queue(Responder.payloadTooLarge(limit: limit))
        case .tokenRead:
            state = .answered
            return .queueTokenRead
        case .waiting(let pending):
            return .takeOrSuspend(pending)
        case .admitted(let admitted):
            state = .responding(admitted)
            return .respond(admitted)
        }
    }

    /// The body is complete, and its trailer fields (after a chunked body) are refused with
    /// `response` (RequestTrailerCheck in MicroHTTPDServer: too large for the answer to fit
    /// beside them, or folded). A request not yet answered is answered `response` instead of being
    /// carried out, whatever its head decided; one already answered, or waiting for its answer,
    /// goes on as `complete()` says.
    /// - Returns: `.queue(response)`, or what `complete()` returns.
    public mutating func trailerRefused(_ response: HTTPResponse) -> Action {
        switch state {
        case .admitted, .tokenRead, .refused, .tooLarge:
            state = .answered
            return .queue(response)
        case .idle, .answered, .responding, .waiting:
            return complete()
        }
    }

    /// The responder replied to `.respond`.
    /// - Returns: `.queue`, `.openStream`, or `.takeOrSuspend` for an answer decided later.
    public mutating func replied(_ reply: Responder.Reply) -> Action {
        guard case .responding(let admitted) = state else { return .none }
        switch reply {
        case .response(let response):
            state = .answered
            return .queue(response)
        case .eventStream:
            state = .answered
            return .openStream(admitted)
        case .later(let pending):
            state = .waiting(pending)
            return .takeOrSuspend(pending)
        }
    }

    /// A pending answer was taken and queued (after `.takeOrSuspend`).
    public mutating func sent() {
        state = .answered
    }
}
