import ForgePushToken
import ForgePushTokenTestSupport
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing
import TokenService

extension LiveServerTests {
    /// Issues 13 and 14 through a live server: the header fields on the wire for every route, and
    /// conditional `GET /token` on each of the engine's paths (the cached fast path, the cached
    /// path with the access log on, and the responder's path when a bearer token guards reads).
    @Suite struct ConditionalGETLiveTests {
        let token = String(repeating: "c3", count: 32)

        @Test("every answer carries nosniff and the cache policy of its route")
        func headerFieldsOnTheWire() throws {
            let live = try LiveServer()
            let cases: [(String, String, String)] = [
                ("GET", "/token", "no-cache"), ("HEAD", "/token", "no-cache"), ("GET", "/healthz", "no-store"),
                ("HEAD", "/healthz", "no-store"), ("GET", "/metrics", "no-store"), ("GET", "/", "no-cache"),
                ("HEAD", "/", "no-cache"), ("GET", "/nope", "no-store"), ("DELETE", "/token", "no-store"),
                ("OPTIONS", "/token", "no-store"), ("POST", "/register", "no-store"),
                ("HEAD", "/token/stream", "no-cache, no-transform"),
            ]
            for (method, target, cacheControl) in cases {
                let response = try live.request(
                    method, target, body: method == "POST" ? Array("zz".utf8) : [],
                    headers: method == "POST" ? ["Content-Type": "text/plain"] : [:])
                #expect(response.headers["x-content-type-options"] == "nosniff", "\(method) \(target)")
                #expect(response.headers["cache-control"] == cacheControl, "\(method) \(target)")
            }
            // The engine's own refusals go through the same place.
            let tooLong = try live.request("GET", "/" + String(repeating: "x", count: 3000))
            #expect(tooLong.status == 414 && tooLong.headers["cache-control"] == "no-store")
            #expect(tooLong.headers["x-content-type-options"] == "nosniff")

            let page = try live.request("GET", "/")
            #expect(page.headers["content-security-policy"] == LivePage.contentSecurityPolicy)
            #expect(page.headers["referrer-policy"] == "no-referrer")
            #expect(page.headers["etag"] == LivePage.entityTag.fieldValue)

            // The event stream's head too.
            let client = try live.client()
            defer { client.close() }
            try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            let (status, headers) = try client.readHead()
            #expect(status == 200 && headers["x-content-type-options"] == "nosniff")
        }

        /// Conditional reads on one keep-alive connection: a 304 with the 200's `Content-Length`
        /// and no body (the next answer on the connection parses), a weak match, a miss, a
        /// garbled field, and a change of the token.
        func conditionalReads(_ live: LiveServer, headers extra: [String: String] = [:]) throws {
            let client = try live.client()
            defer { client.close() }
            func get(_ method: String = "GET", _ ifNoneMatch: String? = nil) throws -> TestResponse {
                var headers = extra
                if let ifNoneMatch { headers["If-None-Match"] = ifNoneMatch }
                return try client.request(method, "/token", headers: headers)
            }
            let full = try get()
            #expect(full.status == 200)
            let etag = try #require(full.headers["etag"])
            for (method, field) in [
                ("GET", etag), ("HEAD", etag), ("GET", "W/" + etag), ("GET", "\"x\", " + etag), ("GET", "*"),
            ] {
                let response = try get(method, field)
                #expect(response.status == 304, "\(method) If-None-Match: \(field)")
                #expect(response.headers["etag"] == etag)
                #expect(response.headers["content-type"] == nil)
                #expect(
                    response.headers["content-length"] == nil
                        || response.headers["content-length"] == String(full.body.count))
            }
            // Had a 304 carried body bytes, they would be read as the next status line.
            for field in ["\"other\"", "garbled", etag + " junk"] {
                let response = try get("GET", field)
                #expect(response.status == 200 && response.body == full.body, "If-None-Match: \(field)")
            }
            var registerHeaders = extra
            registerHeaders["Content-Type"] = "text/plain"
            #expect(
                try client.request("POST", "/register", body: Array(token.utf8), headers: registerHeaders).status == 200
            )
            let changed = try get("GET", etag)
            #expect(changed.status == 200 && changed.text == #"{"token":"\#(token)"}"#)
            #expect(changed.headers["etag"] != etag)
            let newTag = try #require(changed.headers["etag"])
            #expect(try get("GET", newTag).status == 304)
        }

        @Test("conditional GET /token on the cached fast path, counted as 304 in /metrics")
        func fastPath() throws {
            let live = try LiveServer(accessLog: false)  // the fast path needs the access log off
            try conditionalReads(live)
            // A request is counted when libmicrohttpd reports it finished, after its answer was sent.
            waitUntil("5 GET and 1 HEAD of /token counted 304 in /metrics") {
                let metrics = (try? live.request("GET", "/metrics").text) ?? ""
                return metrics.contains(
                    #"forge_push_token_http_requests_total{route="/token",method="GET",status="304"} 5"#)
                    && metrics.contains(
                        #"forge_push_token_http_requests_total{route="/token",method="HEAD",status="304"} 1"#)
            }
        }

        @Test("conditional GET /token with the access log on: the log line says 304")
        func accessLogPath() throws {
            let live = try LiveServer(accessLog: true)
            try conditionalReads(live)
            waitUntil(#"live.lines.withLock { $0 }.contains { $0.contains("GET /token 304 0 bytes") }"#) {
                live.lines.withLock { $0 }.contains { $0.contains("GET /token 304 0 bytes") }
            }
        }

        @Test("conditional GET /token through the responder (--auth-scope all): private, no-cache")
        func responderPath() throws {
            let secret = "conditional-live-token"
            let live = try LiveServer(authentication: BearerAuthentication(token: secret, scope: .all))
            try conditionalReads(live, headers: ["Authorization": "Bearer \(secret)"])
            let response = try live.request("GET", "/token", headers: ["Authorization": "Bearer \(secret)"])
            #expect(response.headers["cache-control"] == "private, no-cache")
        }
    }
}
