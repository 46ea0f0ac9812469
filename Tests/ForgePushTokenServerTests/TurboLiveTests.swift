import ForgePushTokenTestSupport
import MicroHTTPDServer
import Testing
import TokenService

extension LiveServerTests {
    /// What the daemon-wide `MHD_USE_TURBO` (which detached streams need: no half-close at the
    /// hand-over) could change for every other connection (issue 44, "Wanted 4"): an answer given
    /// before the body is read, on a connection libmicrohttpd then closes, must still arrive whole.
    @Suite struct TurboLiveTests {
        @Test("a POST with a body sent with a read token gets its whole 403, 1,000 times of 1,000")
        func readTokenWriteRefusedWhole() throws {
            let authentication = try #require(
                BearerAuthentication(writeTokens: ["write-token-0123456789"], readTokens: ["read-token-0123456789"]))
            let live = try LiveServer(authentication: authentication, accessLog: false)
            let body = String(repeating: "0", count: 64)
            var whole = 0
            for _ in 0..<1000 {
                let client = try live.client()
                defer { client.close() }
                try? client.send(
                    "POST /register HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer read-token-0123456789\r\n"
                        + "Content-Length: \(body.utf8.count)\r\n\r\n\(body)")
                if let response = try? client.readResponse(method: "POST"), response.status == 403,
                    response.text.contains(#""error":"#)
                {
                    whole += 1
                }
            }
            #expect(whole == 1000)
        }
    }
}
