import ForgePushToken
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

/// `--log-format json` on a live server: access lines with the peer's address, nothing secret.
@Suite("JSON access log, live")
struct JSONAccessLogTests {
    /// The local port of `client`'s socket: the peer port the server sees.
    static func localPort(of client: TestClient) -> Int {
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(client.fd, $0, &length) }
        }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    /// The parsed access lines (those with a `method`), once `count` of them were written (or
    /// those written when the wait gave up, having failed the test).
    ///
    /// Waits for the lines, which the answered requests set in motion (docs/testing.md, "Waiting
    /// in tests").
    static func accessLines(
        _ live: LiveServer, count: Int, sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> [[String: Any]] {
        func parsed() throws -> [[String: Any]] {
            try live.lines.withLock { $0 }.map { line -> [String: Any] in
                #expect(line.hasSuffix("}\n"), "not one JSON line: \(line.debugDescription)")
                return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
            }.filter { $0["method"] != nil }
        }
        try waitUntil("\(count) access lines", sourceLocation: sourceLocation) { try parsed().count >= count }
        return try parsed()
    }

    @Test("each request gets one JSON line with method, path, status, bytes, duration_us and remote")
    func accessFields() throws {
        let live = try LiveServer(logFormat: .json)
        let token = String(repeating: "c0ffee", count: 10) + "abcd"
        let client = try live.client()
        defer { client.close() }
        let port = Self.localPort(of: client)
        #expect(try client.request("POST", "/register", body: Array(token.utf8)).status == 200)
        #expect(try client.request("GET", "/token?access_token=hunter2-secret").status == 200)
        // A raw DEL is no part of a request-target (RFC 9112 §3.2): refused, and logged escaped.
        #expect(try client.request("GET", "/nope\u{7F}").status == 400)
        let lines = try Self.accessLines(live, count: 3)
        #expect(lines.count == 3)
        guard lines.count == 3 else { return }
        #expect(lines.map { $0["method"] as? String } == ["POST", "GET", "GET"])
        #expect(lines.map { $0["path"] as? String } == ["/register", "/token", "/nope\\u{7f}"])
        #expect(lines.map { $0["status"] as? Int } == [200, 200, 400])
        for line in lines {
            #expect(line["level"] as? String == "INFO")
            #expect(line["remote"] as? String == "127.0.0.1:\(port)")
            #expect((line["bytes"] as? Int ?? -1) > 0)
            #expect((line["duration_us"] as? Int ?? -1) >= 0)
        }
        // Neither the device token nor the query's access token is ever written.
        let all = live.lines.withLock { $0.joined() }
        #expect(!all.contains(token) && !all.contains("hunter2") && !all.contains("access_token"))
    }
}
