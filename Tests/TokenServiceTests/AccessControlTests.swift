import ForgePushToken
import ForgePushTokenOwner
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Bearer-token authentication (issue 5, RFC 6750) through `Responder`.
@Suite("Bearer authentication")
struct BearerAuthenticationTests {
    static let secret = "s3cret-TOKEN_value.0123456789~+/=="

    func responder(scope: BearerAuthentication.Scope = .writes) throws -> Responder {
        let authentication = try #require(BearerAuthentication(token: Self.secret, scope: scope))
        return Responder(owner: makeOwner(maxSubscribers: 4), authentication: authentication)
    }

    func bearer(_ token: String) -> HTTPHeaders { ["Authorization": "Bearer " + token] }

    @Test(
        "b64token syntax (RFC 6750 §2.1)",
        arguments: [
            ("abc", true), ("A-Z.a_z~0+9/", true), ("abc==", true), ("a=b", false), ("=", false), ("", false),
            ("has space", false), ("tab\t", false), ("naïve", false), ("quote\"", false), ("comma,", false),
        ])
    func tokenSyntax(token: String, valid: Bool) {
        #expect(BearerAuthentication.isValidToken(token) == valid)
        #expect((BearerAuthentication(token: token) != nil) == valid)
    }

    @Test("writes need the token: missing → 401 with a Bearer challenge, state unchanged")
    func missingToken() throws {
        let responder = try responder()
        for path in ["/register", "/fail"] {
            let response = try responder.send("POST", path, contentType: "text/plain", body: utf8("abcd"))
            try expectError(response, status: 401, code: "unauthorized")
            #expect(response.headers["WWW-Authenticate"] == "Bearer realm=\"forge-push-token\"")
        }
        #expect(responder.owner.current == TokenSnapshot(version: 0, token: nil))
        #expect(
            responder.metrics.render(subscribers: 0, events: .init(sent: 0, skipped: 0))
                .contains("forge_push_token_unauthorized_requests_total 2"))
    }

    @Test(
        "wrong tokens → 401 invalid_token, whatever they share with the secret",
        arguments: [
            "wrong",
            String(Self.secret.dropLast()) + "A",  // same length, last byte differs
            "X" + String(Self.secret.dropFirst()),  // same length, first byte differs
            Self.secret + "x",  // the secret and one more byte
            String(Self.secret.dropLast()),  // a prefix of the secret
            Self.secret.uppercased(),
        ])
    func wrongToken(token: String) throws {
        let responder = try responder()
        let response = try responder.send(
            "POST", "/register", contentType: "text/plain", body: utf8("abcd"),
            headers: bearer(token))
        try expectError(response, status: 401, code: "unauthorized")
        #expect(response.headers["WWW-Authenticate"] == "Bearer realm=\"forge-push-token\", error=\"invalid_token\"")
        #expect(!string(response.body).contains(Self.secret))
        #expect(responder.owner.current.token == nil)
    }

    @Test(
        "malformed Authorization values are refused",
        arguments: [
            "Basic dXNlcjpwYXNz", "Bearer", "Bearer ", "Bearer" + secret, "Token " + secret, "",
            " Bearer " + secret,
        ])
    func malformedAuthorization(value: String) throws {
        let responder = try responder()
        let response = try responder.send(
            "POST", "/register", contentType: "text/plain", body: utf8("abcd"),
            headers: ["Authorization": value])
        try expectError(response, status: 401, code: "unauthorized")
    }

    @Test(
        "the right token is accepted; the scheme name is case-insensitive", arguments: ["Bearer", "bearer", "BEARER"])
    func rightToken(scheme: String) throws {
        let responder = try responder()
        let response = try responder.send(
            "POST", "/register", contentType: "text/plain", body: utf8("abcd"),
            headers: ["Authorization": "\(scheme)  \(Self.secret)"])
        #expect(response.status == 200)
        #expect(responder.owner.current.token == "abcd")
        let failed = try responder.send("POST", "/fail", headers: bearer(Self.secret))
        #expect(failed.status == 200)
        #expect(responder.owner.current.token == nil)
    }

    @Test("scope writes leaves reads, the stream, metrics, the page and /healthz open")
    func writesScopeLeavesReadsOpen() throws {
        let responder = try responder()
        for path in ["/token", "/healthz", "/metrics", "/"] {
            #expect(try responder.send("GET", path).status == 200, "\(path)")
        }
        if case .response(let response) = responder.reply("GET", "/token/stream") {
            Issue.record("the stream should open, got \(response.status)")
        }
        #expect(responder.answersCachedReadsBlindly)
    }

    @Test("scope all protects every route but /healthz; GET and HEAD also take access_token")
    func allScope() throws {
        let responder = try responder(scope: .all)
        #expect(!responder.answersCachedReadsBlindly)
        let encoded = Self.secret.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        for path in ["/token", "/token/stream", "/metrics", "/"] {
            for method in ["GET", "HEAD"] {
                try expectError(try responder.send(method, path), status: 401, code: "unauthorized")
                try expectError(
                    try responder.send(method, path + "?access_token=nope"), status: 401, code: "unauthorized")
                if path != "/token/stream" || method == "HEAD" {
                    #expect(try responder.send(method, path, headers: bearer(Self.secret)).status == 200)
                    #expect(try responder.send(method, path + "?x=1&access_token=" + encoded).status == 200)
                }
            }
        }
        #expect(try responder.send("GET", "/healthz").status == 200)
        #expect(try responder.send("HEAD", "/healthz").status == 200)
    }

    @Test("a POST does not take the token from the query")
    func postIgnoresQueryToken() throws {
        let responder = try responder(scope: .all)
        let encoded = Self.secret.addingPercentEncoding(withAllowedCharacters: .alphanumerics)!
        let response = try responder.send(
            "POST", "/register?access_token=" + encoded, contentType: "text/plain",
            body: utf8("abcd"))
        try expectError(response, status: 401, code: "unauthorized")
        #expect(responder.owner.current.token == nil)
    }

    @Test("404 and 405 come before 401; OPTIONS needs no token")
    func orderOfChecks() throws {
        let responder = try responder(scope: .all)
        try expectError(try responder.send("POST", "/nope"), status: 404, code: "not_found")
        try expectError(try responder.send("GET", "/register"), status: 405, code: "method_not_allowed")
        #expect(try responder.send("OPTIONS", "/register").status == 204)
    }

    @Test("constant-time comparison agrees with ==")
    func constantTimeEquals() {
        let secret = Array("abcdef".utf8)
        for candidate in ["abcdef", "abcdeF", "abcde", "abcdefg", "", "zzzzzz", "abcabc"] {
            #expect(BearerAuthentication.constantTimeEquals(Array(candidate.utf8), secret) == (candidate == "abcdef"))
        }
        #expect(!BearerAuthentication.constantTimeEquals([UInt8](), []))
    }

    @Test("the description never shows the token")
    func descriptionHidesToken() throws {
        let authentication = try #require(BearerAuthentication(token: Self.secret, scope: .all))
        #expect(!"\(authentication)".contains(Self.secret))
        #expect("\(authentication)" == "Bearer authentication (scope all)")
    }
}

/// CORS and `OPTIONS` (issue 5; WHATWG Fetch, "CORS protocol"; RFC 9110 §9.3.7).
@Suite("Cross-origin requests")
struct CrossOriginTests {
    func responder(_ origins: [String]) throws -> Responder {
        Responder(owner: makeOwner(maxSubscribers: 4), crossOrigin: try CrossOriginPolicy(origins: origins))
    }

    @Test(
        "origin syntax",
        arguments: [
            ("https://app.example.com", true), ("http://localhost:3000", true), ("HTTPS://APP.EXAMPLE", true),
            ("http://[::1]:8080", true), ("http://127.0.0.1", true), ("*", true),
            ("app.example.com", false), ("https://app.example.com/", false), ("https://a/b", false),
            ("ftp://a", false), ("https://", false), ("https://a:", false), ("https://a:123456", false),
            ("https://a b", false), ("null", false), ("", false),
        ])
    func originSyntax(origin: String, valid: Bool) {
        #expect(((try? CrossOriginPolicy(origins: [origin])) != nil) == valid)
    }

    @Test("Access-Control-Allow-Origin is the configured origin (serialized), not the request's spelling")
    func allowOriginIsTheConfiguredSpelling() throws {
        let policy = try CrossOriginPolicy(origins: ["HTTPS://App.Example", "http://localhost:3000"])
        #expect(policy.origins == ["https://app.example", "http://localhost:3000"])
        let responder = try responder(["https://app.example"])
        let shouted = try responder.sent("GET", "/token", headers: ["Origin": "HTTPS://APP.EXAMPLE"])
        #expect(shouted.headers["Access-Control-Allow-Origin"] == "https://app.example")
        let browser = try Responder(owner: makeOwner(maxSubscribers: 4), crossOrigin: policy)
            .sent("GET", "/token", headers: ["Origin": "https://app.example"])
        #expect(browser.headers["Access-Control-Allow-Origin"] == "https://app.example")
    }

    @Test("an allowed origin gets Access-Control-Allow-Origin and Vary on GET /token and the stream")
    func allowedOrigin() throws {
        let responder = try responder(["https://app.example", "http://localhost:3000"])
        #expect(!responder.answersCachedReadsBlindly)
        let response = try responder.sent("GET", "/token", headers: ["Origin": "https://app.example"])
        #expect(response.status == 200)
        #expect(response.headers["Access-Control-Allow-Origin"] == "https://app.example")
        #expect(response.headers["Vary"] == "Origin")
        let (head, subscriber) = responder.openEventStream(origin: "http://localhost:3000", wake: {})
        #expect(head.status == 200 && subscriber != nil)
        #expect(
            responder.completed(head.headers, origin: "http://localhost:3000")["Access-Control-Allow-Origin"]
                == "http://localhost:3000")
        #expect(head.headers["Content-Type"] == "text/event-stream")
        // An error answer to an allowed origin is readable by the page too.
        let refused = try responder.sent(
            "POST", "/register", contentType: "text/plain", body: utf8("xyz"),
            headers: ["Origin": "https://app.example"])
        #expect(refused.status == 400 && refused.headers["Access-Control-Allow-Origin"] == "https://app.example")
    }

    @Test("other origins, and requests without Origin, get no CORS fields")
    func otherOrigins() throws {
        let responder = try responder(["https://app.example"])
        for headers: HTTPHeaders in [["Origin": "https://evil.example"], ["Origin": "https://app.example.evil"], [:]] {
            let response = try responder.sent("GET", "/token", headers: headers)
            #expect(response.status == 200)
            #expect(response.headers["Access-Control-Allow-Origin"] == nil)
        }
        let (head, _) = responder.openEventStream(origin: "https://evil.example", wake: {})
        #expect(head.headers["Access-Control-Allow-Origin"] == nil)
        #expect(responder.completed(head.headers, origin: "https://evil.example")["Access-Control-Allow-Origin"] == nil)
    }

    @Test("* allows every origin")
    func anyOrigin() throws {
        let responder = try responder(["*"])
        let response = try responder.sent("GET", "/token", headers: ["Origin": "https://anything.example"])
        #expect(response.headers["Access-Control-Allow-Origin"] == "*")
    }

    @Test("preflight from an allowed origin: 204 with the Access-Control-Allow fields, once each")
    func preflightAllowed() throws {
        let responder = try responder(["https://app.example"])
        let response = try responder.sent(
            "OPTIONS", "/register",
            headers: [
                "Origin": "https://app.example", "Access-Control-Request-Method": "POST",
            ])
        #expect(response.status == 204 && response.body.isEmpty)
        #expect(response.headers["Access-Control-Allow-Origin"] == "https://app.example")
        #expect(response.headers["Access-Control-Allow-Methods"] == "POST, OPTIONS")
        #expect(response.headers["Access-Control-Allow-Headers"]?.contains("Authorization") == true)
        #expect(response.headers["Access-Control-Max-Age"] == "600")
        #expect(response.headers.filter { $0.name == "Access-Control-Allow-Origin" }.count == 1)
        #expect(responder.owner.current.version == 0)
    }

    @Test("preflight from another origin, or with CORS off: 403 origin_not_allowed naming the flag")
    func preflightRefused() throws {
        for origins in [["https://app.example"], []] {
            let responder = try responder(origins)
            let response = try responder.sent(
                "OPTIONS", "/token/stream",
                headers: [
                    "Origin": "https://evil.example", "Access-Control-Request-Method": "GET",
                ])
            let message = try expectError(response, status: 403, code: "origin_not_allowed")
            #expect(message.contains("--cors-origin https://evil.example"))
        }
    }

    @Test("plain OPTIONS: 204 with Allow on every route; 404 on unknown paths", arguments: Route.allCases)
    func plainOptions(route: Route) throws {
        let responder = try responder([])
        let response = try responder.sent("OPTIONS", route.rawValue)
        #expect(response.status == 204)
        #expect(response.headers["Allow"] == route.allowedMethods.joined(separator: ", "))
        #expect(response.headers["Allow"]?.hasSuffix("OPTIONS") == true)
        try expectError(try responder.sent("OPTIONS", "/nope"), status: 404, code: "not_found")
    }
}
