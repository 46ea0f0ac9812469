import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing
import TokenService

#if canImport(Glibc)
    import Glibc
#endif

extension LiveServerTests {
    /// One real request per route against a live server, and request bodies as clients really send
    /// them: split across writes, with `Expect: 100-continue`, chunked, oversized.
    @Suite struct RouteTests {
        let token = String(repeating: "a1", count: 32)

        @Test func everyRouteAnswersOverASocket() throws {
            let live = try LiveServer()
            let empty = try live.request("GET", "/token")
            #expect(empty.status == 200)
            #expect(empty.text == #"{"token":null}"#)
            #expect(empty.headers["content-type"] == "application/json; charset=utf-8")
            #expect(empty.headers["cache-control"] == "no-cache")
            #expect(empty.headers["etag"] == EntityTag.strong(digesting: Array(#"{"token":null}"#.utf8)).fieldValue)

            let registered = try live.request(
                "POST", "/register", body: Array(token.uppercased().utf8),
                headers: ["Content-Type": "application/x-www-form-urlencoded"])
            #expect(registered.status == 200)
            #expect(registered.text == #"{"changed":true,"token":"\#(token)"}"#)
            #expect(try live.request("GET", "/token?x=1").text == #"{"token":"\#(token)"}"#)

            let head = try live.request("HEAD", "/token")
            #expect(head.status == 200 && head.body.isEmpty)
            #expect(head.headers["content-length"] == String(#"{"token":"\#(token)"}"#.utf8.count))

            let failed = try live.request(
                "POST", "/fail", body: Array("denied".utf8), headers: ["Content-Type": "text/plain"])
            #expect(failed.text == #"{"changed":true,"token":null}"#)

            #expect(try live.request("GET", "/healthz").text == #"{"status":"ok"}"#)
            let missing = try live.request("GET", "/nope")
            #expect(missing.status == 404 && missing.text.contains(#""error":"not_found""#))
            let wrong = try live.request("DELETE", "/token")
            #expect(wrong.status == 405 && wrong.headers["allow"] == "GET, HEAD, OPTIONS")

            let streamHead = try live.request("HEAD", "/token/stream")
            #expect(streamHead.status == 200 && streamHead.headers["content-type"] == "text/event-stream")
        }

        @Test func keepAliveServesManyRequestsOnOneConnection() throws {
            let live = try LiveServer()
            let client = try live.client()
            defer { client.close() }
            for index in 1...20 {
                let hex = String(repeating: "0", count: 62) + String(format2: index)
                let response = try client.request(
                    "POST", "/register", body: Array(hex.utf8), headers: ["Content-Type": "text/plain"])
                #expect(response.status == 200)
                #expect(response.headers["connection"]?.lowercased() != "close")
            }
        }

        @Test func bodySplitAcrossSeveralWrites() throws {
            let live = try LiveServer()
            let client = try live.client()
            defer { client.close() }
            try client.send(
                "POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: \(token.utf8.count)\r\n\r\n"
            )
            for piece in stride(from: 0, to: token.utf8.count, by: 7) {
                let end = min(piece + 7, token.utf8.count)
                try client.send(Array(Array(token.utf8)[piece..<end]))
                // Each piece is read by the server before the next is sent: a read of its own.
                waitUntil("the server to read the body's piece at \(piece)") { client.serverHasReadAll }
            }
            let response = try client.readResponse()
            #expect(response.status == 200)
            #expect(live.owner.current.token == token)
        }

        @Test func expectContinueIsAnswered() throws {
            let live = try LiveServer()
            let client = try live.client()
            defer { client.close() }
            try client.send(
                "POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: \(token.utf8.count)\r\nExpect: 100-continue\r\n\r\n"
            )
            let (interim, _) = try client.readHead()
            #expect(interim == 100)
            try client.send(token)
            let response = try client.readResponse()
            #expect(response.status == 200)
            #expect(live.owner.current.token == token)
        }

        @Test func chunkedRequestBody() throws {
            let live = try LiveServer()
            let client = try live.client()
            defer { client.close() }
            let half = token.utf8.count / 2
            let first = String(token.prefix(half))
            let second = String(token.dropFirst(half))
            try client.send(
                "POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            try client.send("\(String(half, radix: 16))\r\n\(first)\r\n")
            // The first chunk is read by the server before the second is sent.
            waitUntil("the server to read the first chunk") { client.serverHasReadAll }
            try client.send("\(String(half, radix: 16))\r\n\(second)\r\n0\r\n\r\n")
            let response = try client.readResponse()
            #expect(response.status == 200)
            #expect(live.owner.current.token == token)
        }

        @Test func oversizedBodiesAre413AndChangeNothing() throws {
            let live = try LiveServer { $0.maxBodyBytes = 64 }
            let declared = try live.request(
                "POST", "/register", body: Array(repeating: UInt8(ascii: "a"), count: 66),
                headers: ["Content-Type": "text/plain"])
            #expect(declared.status == 413 && declared.text.contains("payload_too_large"))

            let client = try live.client()
            defer { client.close() }
            try client.send(
                "POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
            for _ in 0..<3 { try client.send("28\r\n\(String(repeating: "ab", count: 20))\r\n") }
            try client.send("0\r\n\r\n")
            let chunked = try client.readResponse()
            #expect(chunked.status == 413)
            #expect(live.owner.current.version == 0)
            #expect(live.owner.current.token == nil)
        }

        @Test func busyPortIsReportedAsAddressInUse() throws {
            let live = try LiveServer()
            var configuration = ServerConfiguration()
            configuration.port = live.port
            let other = try MicroHTTPDServer(
                configuration: configuration, application: live.responder, log: ServerLog { _ in })
            #expect(throws: ServerError.addressInUse("127.0.0.1:\(live.port)")) { try other.start() }
        }

        @Test func accessLogLineNamesMethodPathStatusBytesAndMicroseconds() throws {
            let live = try LiveServer()
            _ = try live.request("GET", "/token")
            waitUntil("the access line of GET /token 200 14 bytes, in microseconds") {
                live.lines.withLock {
                    $0.contains { $0.contains("GET /token 200 14 bytes") && $0.hasSuffix(" us\n") }
                }
            }
        }
    }
}

extension String {
    /// `index` as two lowercase hex digits.
    init(format2 index: Int) {
        let hex = String(index, radix: 16)
        self = hex.count == 1 ? "0" + hex : hex
    }
}
