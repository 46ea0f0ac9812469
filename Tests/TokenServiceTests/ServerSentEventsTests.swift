import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// The `text/event-stream` framing (http-api.md, `GET /token/stream`; WHATWG HTML §9.2).
@Suite("Server-Sent Events framing")
struct ServerSentEventsTests {
    @Test("an event is id, event and data lines, then an empty line, LF only")
    func eventBytes() {
        let event = ServerSentEvents.event(id: 3, name: "token", data: utf8(#"{"token":"ab"}"#))
        #expect(event == utf8("id: 3\nevent: token\ndata: {\"token\":\"ab\"}\n\n"))
        #expect(string(event) == #"id: 3"# + "\n" + #"event: token"# + "\n" + #"data: {"token":"ab"}"# + "\n\n")
    }

    @Test("a comment is a colon line and an empty line")
    func commentBytes() {
        #expect(ServerSentEvents.comment("hello there") == utf8(": hello there\n\n"))
        #expect(ServerSentEvents.comment("") == utf8(": \n\n"))
    }

    @Test("the heartbeat is exactly ': keep-alive' LF LF")
    func heartbeatBytes() {
        #expect(ServerSentEvents.heartbeat == utf8(": keep-alive\n\n"))
        #expect(
            ServerSentEvents.heartbeat == [
                0x3a, 0x20, 0x6b, 0x65, 0x65, 0x70, 0x2d, 0x61, 0x6c, 0x69, 0x76, 0x65, 0x0a, 0x0a,
            ])
    }

    @Test("the retry line carries whole milliseconds", arguments: [0, 1, 3000, 86_400_000])
    func retryBytes(milliseconds: Int) {
        let bytes = ServerSentEvents.retry(milliseconds: milliseconds)
        #expect(bytes == utf8("retry: \(milliseconds)\n\n"))
    }

    @Test("no CR and no byte-order mark in anything framed")
    func noCarriageReturnNoBOM() {
        let samples: [[UInt8]] = [
            ServerSentEvents.event(id: 0, name: "token", data: utf8(#"{"token":null}"#)),
            ServerSentEvents.event(id: UInt64.max, name: "token", data: utf8("x")),
            ServerSentEvents.comment("keep-alive"),
            ServerSentEvents.heartbeat,
            ServerSentEvents.retry(milliseconds: 2500),
            TokenSnapshot(version: 0, token: nil).event,
            TokenSnapshot(version: 7, token: lowerHex(tokenBytes(256))).event,
        ]
        for sample in samples {
            #expect(!sample.contains(0x0d), "CR in \(string(sample))")
            #expect(!sample.starts(with: [0xef, 0xbb, 0xbf]), "BOM in \(string(sample))")
            #expect(String(validating: sample, as: UTF8.self) != nil)
            #expect(sample.suffix(2) == [0x0a, 0x0a], "every block ends with an empty line")
        }
    }

    @Test("event-stream response header fields")
    func responseHeaders() {
        let headers = ServerSentEvents.responseHeaders
        #expect(ServerSentEvents.contentType == "text/event-stream")
        #expect(headers["Content-Type"] == "text/event-stream")
        #expect(headers["Cache-Control"] == "no-cache, no-transform")
        #expect(headers["X-Accel-Buffering"] == "no")
        #expect(headers["Content-Encoding"] == nil)
        #expect(headers.fields.count == 3)
    }
}
