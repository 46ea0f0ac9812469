import HTTPServing
import ServerSupport
import Testing

@testable import MicroHTTPDServer

/// Issue 19 §3, issue 31: the engine's per-request state machine, as plain values: every event in,
/// every step or body verdict out, no sockets.
@Suite("Request state machine")
struct RequestStateMachineTests {
    static let limit = 16

    /// `step` in a few words, so that sequences compare as text.
    func describe(_ step: RequestStateMachine.Step) -> String {
        switch step {
        case .readOn: "readOn"
        case .queue(let response): "queue \(response.status)"
        case .queueCachedRead: "queueCachedRead"
        case .respond: "respond"
        case .openStream: "openStream"
        case .takeOrSuspend: "takeOrSuspend"
        case .none: "none"
        }
    }

    /// `verdict` in a word.
    func describe(_ verdict: RequestStateMachine.BodyVerdict) -> String {
        switch verdict {
        case .keep: "keep"
        case .drop: "drop"
        case .discardAll: "discardAll"
        case .close: "close"
        }
    }

    func refusal(_ status: Int) -> HTTPResponse {
        .error(status, ServiceError("x", "y"))
    }

    @Test("a request without a body is answered at its end, whether or not it asked for 100-continue")
    func requestWithoutBodyIsAnsweredAtItsEnd() {
        // libmicrohttpd sends 100 Continue to a bodiless request that asks for it; the engine
        // answers it at the end (issue 27 §6), not in the first call, which closed the connection.
        var write = RequestStateMachine(limit: Self.limit)
        #expect(describe(write.head(.admitted, contentLength: 0, chunked: false)) == "readOn")
        #expect(describe(write.complete()) == "respond")
        #expect(describe(write.replied(.response(.json(200, [])))) == "queue 200")
        #expect(describe(write.complete()) == "none")
        var read = RequestStateMachine(limit: Self.limit)
        #expect(describe(read.head(.cachedRead, contentLength: nil, chunked: false)) == "readOn")
        #expect(describe(read.complete()) == "queueCachedRead")
    }

    @Test("a refusal without a body waits for the next call, which answers it; then nothing more")
    func refusalWithoutBody() {
        var machine = RequestStateMachine(limit: Self.limit)
        #expect(describe(machine.head(.refused(refusal(404)), contentLength: nil, chunked: false)) == "readOn")
        #expect(describe(machine.complete()) == "queue 404")
        #expect(describe(machine.complete()) == "none")
    }

    @Test(
        "a refusal of a request with a body, or of its framing, is answered at once, the body unread",
        arguments: [
            (404, UInt64(5), false), (401, nil, true), (400, nil, false), (417, nil, false), (501, UInt64(0), false),
        ] as [(Int, UInt64?, Bool)])
    func refusalAtOnce(status: Int, contentLength: UInt64?, chunked: Bool) {
        var machine = RequestStateMachine(limit: Self.limit)
        #expect(
            describe(machine.head(.refused(refusal(status)), contentLength: contentLength, chunked: chunked))
                == "queue \(status)")
        #expect(describe(machine.bodyChunk(count: 4)) == "drop")
        #expect(describe(machine.complete()) == "none")
    }

    @Test("a Content-Length over the limit: 413 at once, for the responder's routes and the token read alike")
    func contentLengthOverLimit() {
        for head in [RequestStateMachine.Head.admitted, .cachedRead] {
            var machine = RequestStateMachine(limit: Self.limit)
            #expect(describe(machine.head(head, contentLength: UInt64(Self.limit + 1), chunked: false)) == "queue 413")
            #expect(describe(machine.complete()) == "none")
        }
        var atLimit = RequestStateMachine(limit: Self.limit)
        #expect(
            describe(atLimit.head(.admitted, contentLength: UInt64(Self.limit), chunked: false)) == "readOn"
        )
    }

    @Test("a body within the limit is kept and handed to the responder; its reply is queued")
    func bodyWithinLimit() {
        var machine = RequestStateMachine(limit: Self.limit)
        #expect(describe(machine.head(.admitted, contentLength: 16, chunked: false)) == "readOn")
        #expect(describe(machine.bodyChunk(count: 10)) == "keep")
        #expect(describe(machine.bodyChunk(count: 6)) == "keep")
        #expect(machine.kept == 16 && machine.received == 16)
        #expect(describe(machine.complete()) == "respond")
        #expect(describe(machine.complete()) == "none", "a call while the responder is asked does nothing")
        #expect(describe(machine.replied(.response(HTTPResponse(status: 200)))) == "queue 200")
        #expect(describe(machine.complete()) == "none")
    }

    @Test("a chunked body over the limit: what was kept is discarded, the rest dropped, 413 at its end")
    func chunkedOverLimit() {
        var machine = RequestStateMachine(limit: Self.limit)
        #expect(describe(machine.head(.admitted, contentLength: nil, chunked: true)) == "readOn")
        #expect(describe(machine.bodyChunk(count: 10)) == "keep")
        #expect(describe(machine.bodyChunk(count: 7)) == "discardAll")
        #expect(describe(machine.bodyChunk(count: 100)) == "drop")
        #expect(machine.kept == 0 && machine.received == 117)
        #expect(describe(machine.complete()) == "queue 413")
    }

    @Test(
        "trailer fields refused at the body's end: the write is answered with the refusal, never asked of the responder"
    )
    func trailerRefused() {
        // Issue 27 §6: a chunked write whose trailer leaves no room for its answer.
        var write = RequestStateMachine(limit: Self.limit)
        #expect(describe(write.head(.admitted, contentLength: nil, chunked: true)) == "readOn")
        #expect(describe(write.bodyChunk(count: 8)) == "keep")
        #expect(describe(write.trailerRefused(refusal(431))) == "queue 431")
        #expect(describe(write.complete()) == "none", "nothing is carried out after the refusal")
        // A head refused with a chunked body was answered at once: no second answer.
        var refused = RequestStateMachine(limit: Self.limit)
        #expect(describe(refused.head(.refused(refusal(404)), contentLength: nil, chunked: true)) == "queue 404")
        #expect(describe(refused.trailerRefused(refusal(431))) == "none")
        // Otherwise the refusal is the answer: instead of a 413, of a token read.
        var tooLarge = RequestStateMachine(limit: Self.limit)
        _ = tooLarge.head(.admitted, contentLength: nil, chunked: true)
        _ = tooLarge.bodyChunk(count: 100)
        #expect(describe(tooLarge.trailerRefused(refusal(431))) == "queue 431")
        var read = RequestStateMachine(limit: Self.limit)
        _ = read.head(.cachedRead, contentLength: nil, chunked: true)
        #expect(describe(read.trailerRefused(refusal(400))) == "queue 400")
        // Already asked of the responder: no second answer.
        var asked = RequestStateMachine(limit: Self.limit)
        _ = asked.head(.admitted, contentLength: nil, chunked: true)
        #expect(describe(asked.complete()) == "respond")
        #expect(describe(asked.trailerRefused(refusal(431))) == "none")
    }

    @Test("an endless over-limit body is cut off past the drop limit: close, no answer")
    func endlessBody() {
        var machine = RequestStateMachine(limit: Self.limit)
        _ = machine.head(.admitted, contentLength: nil, chunked: true)
        #expect(describe(machine.bodyChunk(count: Self.limit + 1)) == "discardAll")
        #expect(describe(machine.bodyChunk(count: machine.dropLimit - Self.limit - 1)) == "drop")
        #expect(describe(machine.bodyChunk(count: 1)) == "close")
    }

    @Test("GET /token/stream: the responder's .eventStream opens the stream")
    func eventStream() {
        var machine = RequestStateMachine(limit: Self.limit)
        _ = machine.head(.admitted, contentLength: nil, chunked: false)
        #expect(describe(machine.complete()) == "respond")
        #expect(describe(machine.replied(.eventStream)) == "openStream")
        #expect(describe(machine.complete()) == "none")
    }

    @Test("an answer decided later: take it or suspend; each resume tries again; once sent, nothing more")
    func later() {
        var machine = RequestStateMachine(limit: Self.limit)
        _ = machine.head(.admitted, contentLength: 2, chunked: false)
        _ = machine.bodyChunk(count: 2)
        _ = machine.complete()
        let pending = PendingResponse()
        guard case .takeOrSuspend(let first) = machine.replied(.later(pending)) else {
            Issue.record("a later answer is not taken or waited for")
            return
        }
        #expect(first === pending)
        #expect(describe(machine.complete()) == "takeOrSuspend", "resumed")
        machine.sent()
        #expect(describe(machine.complete()) == "none")
        #expect(
            describe(machine.replied(.response(HTTPResponse(status: 200)))) == "none",
            "no reply was asked for")
    }

    @Test("GET /token from the cache: after its body (if any, within the limit), the cached answer")
    func tokenRead() {
        var plain = RequestStateMachine(limit: Self.limit)
        #expect(describe(plain.head(.cachedRead, contentLength: nil, chunked: false)) == "readOn")
        #expect(describe(plain.complete()) == "queueCachedRead")
        #expect(describe(plain.complete()) == "none")

        var chunked = RequestStateMachine(limit: Self.limit)
        _ = chunked.head(.cachedRead, contentLength: nil, chunked: true)
        #expect(describe(chunked.bodyChunk(count: Self.limit + 1)) == "discardAll")
        #expect(describe(chunked.complete()) == "queue 413")
    }
}
