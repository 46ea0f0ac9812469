import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing
import TokenService

#if canImport(Glibc)
    import Glibc
#endif

extension LiveServerTests {
    /// Issue 19 §3, "CORS by wrapping": with CORS on, every answer the service sends carries the
    /// CORS fields for the request's `Origin`, the engine's own answers (413 for both kinds of
    /// body, 414, 431, 408, the framing refusals) as much as the responder's, because the engine
    /// adds them in one place, where it completes every answer's header. libmicrohttpd's own error
    /// pages are the documented exception (docs/http-api.md).
    @Suite struct CrossOriginLiveTests {
        static let origin = "https://app.example"

        /// A request of raw text, from `origin`, and what a browser needs to read the answer.
        struct Case: Sendable, CustomTestStringConvertible {
            let name: String
            /// The request, with `{ORIGIN}` where its `Origin` field goes.
            let request: String
            let status: Int
            var testDescription: String { name }
        }

        static let maxBodyBytes = 64
        static let maxURLBytes = 64

        static let cases: [Case] = [
            Case(
                name: "GET /token (the responder's answer)", request: "GET /token HTTP/1.1\r\nHost: x\r\n{ORIGIN}\r\n",
                status: 200),
            Case(
                name: "POST /register of a bad body (the responder's 400)",
                request: "POST /register HTTP/1.1\r\nHost: x\r\n{ORIGIN}Content-Type: text/plain\r\n"
                    + "Content-Length: 3\r\n\r\nxyz", status: 400),
            Case(name: "an unknown path (404)", request: "GET /nope HTTP/1.1\r\nHost: x\r\n{ORIGIN}\r\n", status: 404),
            Case(
                name: "a method the route does not take (405)",
                request: "DELETE /token HTTP/1.1\r\nHost: x\r\n{ORIGIN}\r\n", status: 405),
            Case(
                name: "a Content-Length over the limit (the engine's 413)",
                request: "POST /register HTTP/1.1\r\nHost: x\r\n{ORIGIN}Content-Type: text/plain\r\n"
                    + "Content-Length: 100\r\n\r\n", status: 413),
            Case(
                name: "a chunked body over the limit (the engine's 413)",
                request: "POST /register HTTP/1.1\r\nHost: x\r\n{ORIGIN}Content-Type: text/plain\r\n"
                    + "Transfer-Encoding: chunked\r\n\r\n50\r\n" + String(repeating: "a", count: 80) + "\r\n0\r\n\r\n",
                status: 413),
            Case(
                name: "a target over --max-url-bytes (the engine's 414)",
                request: "GET /token?" + String(repeating: "q", count: 100) + " HTTP/1.1\r\nHost: x\r\n{ORIGIN}\r\n",
                status: 414),
            Case(
                name: "a head over --max-header-bytes (the engine's 431)",
                request: "GET /token HTTP/1.1\r\nHost: x\r\n{ORIGIN}X-Pad: " + String(repeating: "p", count: 36_400)
                    + "\r\n\r\n", status: 431),
            Case(
                name: "two Content-Length fields (a framing refusal, 400)",
                request:
                    "POST /register HTTP/1.1\r\nHost: x\r\n{ORIGIN}Content-Length: 4\r\nContent-Length: 5\r\n\r\nabcd",
                status: 400),
            Case(
                name: "an unmet expectation (a framing refusal, 417)",
                request: "GET /token HTTP/1.1\r\nHost: x\r\n{ORIGIN}Expect: something-else\r\n\r\n", status: 417),
            Case(
                name: "a transfer coding other than chunked (501)",
                request: "POST /register HTTP/1.1\r\nHost: x\r\n{ORIGIN}Transfer-Encoding: gzip\r\n\r\nabcd",
                status: 501),
            Case(
                name: "an HTTP/1.1 request without Host (a framing refusal, 400)",
                request: "GET /token HTTP/1.1\r\n{ORIGIN}\r\n", status: 400),
        ]

        static func live(crossOrigin: Bool, clock: ServerClock = .monotonic) throws -> LiveServer {
            try LiveServer(
                crossOrigin: crossOrigin ? try CrossOriginPolicy(origins: [origin]) : CrossOriginPolicy(),
                accessLog: false
            ) {
                $0.maxBodyBytes = maxBodyBytes
                $0.maxURLBytes = maxURLBytes
                $0.headerTimeoutSeconds = 1
                $0.clock = clock
            }
        }

        @Test("with CORS on, every answer carries the CORS fields for an allowed Origin", arguments: cases)
        func everyAnswerCarriesThem(_ item: Case) throws {
            let live = try Self.live(crossOrigin: true)
            for origin in [Self.origin, "https://other.example", nil] {
                let client = try live.client()
                defer { client.close() }
                try client.send(
                    item.request.replacingOccurrences(of: "{ORIGIN}", with: origin.map { "Origin: \($0)\r\n" } ?? ""))
                let response = try client.readResponse(method: "POST")
                #expect(response.status == item.status, "\(response.text)")
                // The service's own JSON, not libmicrohttpd's error page (the documented exception).
                #expect(response.headers["content-type"]?.hasPrefix("application/json") == true, "\(response.text)")
                #expect(
                    response.headers["access-control-allow-origin"] == (origin == Self.origin ? Self.origin : nil),
                    "Origin \(origin ?? "none")")
                #expect(
                    response.headers["access-control-expose-headers"]
                        == (origin == Self.origin
                            ? CrossOriginPolicy.exposedHeaders : nil))
                #expect(response.headers["vary"] == "Origin")
                #expect(response.headers["x-content-type-options"] == "nosniff")
            }
        }

        @Test(
            "with CORS off, no answer carries a CORS field (GET /token from the engine's cache included)",
            arguments: cases)
        func noneWhenOff(_ item: Case) throws {
            let live = try Self.live(crossOrigin: false)
            #expect(live.responder.answersCachedReadsBlindly)
            let client = try live.client()
            defer { client.close() }
            try client.send(item.request.replacingOccurrences(of: "{ORIGIN}", with: "Origin: \(Self.origin)\r\n"))
            let response = try client.readResponse(method: "POST")
            #expect(response.status == item.status, "\(response.text)")
            #expect(response.headers["access-control-allow-origin"] == nil)
            #expect(response.headers["vary"] == nil)
        }

        @Test("the event stream's head carries them")
        func eventStream() throws {
            let live = try Self.live(crossOrigin: true)
            let client = try live.client()
            defer { client.close() }
            try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\nOrigin: \(Self.origin)\r\n\r\n")
            let (status, headers) = try client.readHead()
            #expect(status == 200 && headers["content-type"] == "text/event-stream")
            #expect(headers["access-control-allow-origin"] == Self.origin && headers["vary"] == "Origin")
            _ = try client.readStream(until: "event: token")
        }

        @Test("a body that misses --header-timeout: its 408 carries them; a head that does: Vary alone (no Origin yet)")
        func requestTimeout() throws {
            // On a manual clock, moved 250 ms (a deadline tick) per look until the answer is there.
            let clock = ManualServerClock()
            let live = try Self.live(crossOrigin: true, clock: .manual(clock))
            let body = try live.client()
            defer { body.close() }
            try body.send(
                "POST /register HTTP/1.1\r\nHost: x\r\nOrigin: \(Self.origin)\r\nContent-Type: text/plain\r\n"
                    + "Content-Length: 10\r\n\r\nab")
            waitUntil("the 408 for the late body") {
                clock.advance(by: .milliseconds(250))
                return body.hasBytesToRead
            }
            let late = try body.readResponse()
            #expect(late.status == 408 && late.text.contains("request_timeout"), "\(late.text)")
            #expect(late.headers["access-control-allow-origin"] == Self.origin && late.headers["vary"] == "Origin")

            let head = try live.client()
            defer { head.close() }
            try head.send("GET /token HTTP/1.1\r\nHost: x\r\nOrigin: \(Self.origin)\r\n")
            waitUntil("the 408 for the unfinished head") {
                clock.advance(by: .milliseconds(250))
                return head.hasBytesToRead
            }
            let unfinished = try head.readResponse()
            #expect(unfinished.status == 408)
            #expect(unfinished.headers["access-control-allow-origin"] == nil && unfinished.headers["vary"] == "Origin")
            #expect(live.owner.current.version == 0)
        }
    }
}
