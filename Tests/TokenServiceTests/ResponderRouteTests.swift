import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Routing, methods, `GET /token`, `/healthz` and `/token/stream` through `Responder`
/// (http-api.md, "Common rules" and "Routes").
@Suite("Responder routes")
struct ResponderRouteTests {
    // MARK: 404

    @Test(
        "unknown paths answer 404 not_found",
        arguments: [
            "/nope", "/token/", "/tokens", "/Token", "/TOKEN", "/register/", "/register/x",
            "/token/stream/", "/token/streams", "/healthz/", "//token", "/token%2Fstream", "/fail/1",
            "", "*", "/nope?x=1",
        ])
    func unknownPath(target: String) throws {
        let responder = makeResponder()
        for method in ["GET", "HEAD", "POST", "PUT", "DELETE"] {
            let response = try responder.send(method, target, body: utf8("abcd"))
            try expectError(response, status: 404, code: "not_found")
        }
        #expect(responder.owner.current == TokenSnapshot(version: 0, token: nil))
    }

    @Test("the target splits at the first ? byte, even before a combining mark (fuzz regression)")
    func targetSplitsBeforeACombiningMark() throws {
        let request = HTTPRequest(method: "GET", target: "/token?\u{301}x=1")
        #expect(request.path == "/token" && request.query == "\u{301}x=1")
        #expect(try makeResponder().send("GET", "/token?\u{301}x=1").status == 200)
        #expect(HTTPRequest(method: "GET", target: "/token").query == nil)
        #expect(HTTPRequest(method: "GET", target: "/token?").query == "")
    }

    @Test("a path handed over already split keeps its ?: /token%3Fx names no route (attack regression)")
    func decodedQuestionMarkIsPartOfThePath() throws {
        let request = HTTPRequest(method: "GET", path: "/token?access_token=x", query: nil)
        #expect(request.path == "/token?access_token=x" && request.query == nil)
        guard case .response(let response) = makeResponder().respond(to: request) else {
            Issue.record("expected a response")
            return
        }
        try expectError(response, status: 404, code: "not_found")
    }

    // MARK: 405

    struct WrongMethod: Sendable, CustomTestStringConvertible {
        let path: String
        let method: String
        let allow: String
        var testDescription: String { "\(method) \(path)" }
    }

    static let wrongMethods: [WrongMethod] = {
        var cases: [WrongMethod] = []
        for path in ["/register", "/fail"] {
            for method in ["GET", "HEAD", "PUT", "PATCH", "DELETE", "options", "post", "Post"] {
                cases.append(WrongMethod(path: path, method: method, allow: "POST, OPTIONS"))
            }
        }
        for path in ["/token", "/token/stream", "/healthz"] {
            for method in ["POST", "PUT", "PATCH", "DELETE", "TRACE", "get", "head", "options"] {
                cases.append(WrongMethod(path: path, method: method, allow: "GET, HEAD, OPTIONS"))
            }
        }
        return cases
    }()

    @Test("known path, wrong method: 405 method_not_allowed with Allow", arguments: wrongMethods)
    func wrongMethod(_ wrong: WrongMethod) throws {
        let responder = makeResponder()
        _ = responder.owner.register(deviceToken: [0xab, 0xcd])
        for target in [wrong.path, wrong.path + "?x=1"] {
            let response = try responder.send(wrong.method, target, contentType: "text/plain", body: utf8("0102"))
            try expectError(response, status: 405, code: "method_not_allowed")
            #expect(response.headers["Allow"] == wrong.allow)
            #expect(response.headers.filter { $0.name.lowercased() == "allow" }.count == 1)
        }
        // A refused request never changes state.
        #expect(responder.owner.current == TokenSnapshot(version: 1, token: "abcd"))
    }

    @Test("Route lists the allowed methods of every path")
    func routeAllowedMethods() {
        #expect(Route(path: "/register")?.allowedMethods == ["POST", "OPTIONS"])
        #expect(Route(path: "/fail")?.allowedMethods == ["POST", "OPTIONS"])
        #expect(Route(path: "/token")?.allowedMethods == ["GET", "HEAD", "OPTIONS"])
        #expect(Route(path: "/token/stream")?.allowedMethods == ["GET", "HEAD", "OPTIONS"])
        #expect(Route(path: "/healthz")?.allowedMethods == ["GET", "HEAD", "OPTIONS"])
        #expect(Route(path: "/metrics")?.allowedMethods == ["GET", "HEAD", "OPTIONS"])
        #expect(Route(path: "/")?.allowedMethods == ["GET", "HEAD", "OPTIONS"])
        #expect(Route(path: "/token?x=1") == nil, "Route matches a path; HTTPRequest strips the query")
        #expect(Route.allCases.count == 9)
    }

    @Test("Route(path:) finds every route by its own path and nothing else")
    func routeByPath() {
        for route in Route.allCases {
            #expect(Route(path: route.rawValue) == route)
            #expect(Route(path: route.rawValue + "/") == nil)
            #expect(Route(path: route.rawValue.uppercased()) == (route == .page ? .page : nil))
        }
        for path in [
            "", "//", "/token/", "/token/streams", "/token/x", "/registe", "/register\0", "/Register",
            "/token%2Fstream",
            "/index.html", "/tokens", "/metrics/", "token", " /token",
        ] {
            #expect(Route(path: path) == nil, "\(path)")
        }
    }

    // MARK: Query strings

    @Test("a query string never changes routing")
    func queryNeverChangesRouting() throws {
        let responder = makeResponder()

        let token = try responder.send("GET", "/token?x=1")
        #expect(token.status == 200)
        #expect(token.body == utf8(#"{"token":null}"#))

        let register = try responder.send(
            "POST", "/register?deviceToken=ffff&x=1", contentType: "text/plain",
            body: utf8("abcd"))
        try expectChange(register, token: "abcd", changed: true)

        let again = try responder.send("GET", "/token?", headers: ["Accept": "application/json"])
        #expect(again.body == utf8(#"{"token":"abcd"}"#))

        let health = try responder.send("GET", "/healthz?verbose=1")
        #expect(health.status == 200)

        let fail = try responder.send("POST", "/fail?token=abcd", body: utf8("gone"))
        try expectChange(fail, token: nil, changed: true)

        guard case .eventStream = responder.reply("GET", "/token/stream?since=3") else {
            Issue.record("GET /token/stream?since=3 must start an event stream")
            return
        }
        let headStream = try responder.send("HEAD", "/token/stream?x")
        #expect(headStream.status == 200)

        let notAllowed = try responder.send("DELETE", "/token?x=1")
        #expect(notAllowed.status == 405)
        #expect(notAllowed.headers["Allow"] == "GET, HEAD, OPTIONS")
    }

    @Test("HTTPRequest splits the target at the first ?")
    func requestTargetSplit() {
        let plain = HTTPRequest(method: "GET", target: "/token")
        #expect(plain.path == "/token")
        #expect(plain.query == nil)

        let query = HTTPRequest(method: "GET", target: "/token?x=1?y=2")
        #expect(query.path == "/token")
        #expect(query.query == "x=1?y=2")

        let empty = HTTPRequest(method: "GET", target: "/token?")
        #expect(empty.path == "/token")
        #expect(empty.query == "")
    }

    @Test("header names are matched case-insensitively, in order")
    func headerLookup() {
        var headers: HTTPHeaders = ["Content-Type": "text/plain", "X-One": "1"]
        headers.add("x-one", "2")
        #expect(headers["content-type"] == "text/plain")
        #expect(headers["CONTENT-TYPE"] == "text/plain")
        #expect(headers["x-ONE"] == "1", "the first field of a name wins")
        #expect(headers["Content-Typ"] == nil)
        #expect(headers.map(\.name) == ["Content-Type", "X-One", "x-one"])

        // The responder sees a lower-case Content-Type name just the same.
        let responder = makeResponder()
        let response = responder.respond(
            to: HTTPRequest(
                method: "POST", target: "/register",
                headers: ["content-type": "application/octet-stream"],
                body: [0x01, 0x02]))
        guard case .response(let reply) = response else {
            Issue.record("expected a response")
            return
        }
        #expect(string(reply.body).contains("0102"))
    }

    // MARK: GET /token

    @Test("GET /token: null, then the hex, with no-cache, an ETag and the JSON content type")
    func getToken() throws {
        let responder = makeResponder()
        let empty = try responder.send("GET", "/token")
        #expect(empty.status == 200)
        #expect(empty.body == utf8(#"{"token":null}"#))
        #expect(empty.headers["Content-Type"] == jsonType)
        #expect(empty.headers["Cache-Control"] == "no-cache")
        #expect(empty.headers["ETag"] == EntityTag.strong(digesting: utf8(#"{"token":null}"#)).fieldValue)

        _ = try responder.send(
            "POST", "/register", contentType: "application/octet-stream",
            body: [0x00, 0x0f, 0xa0, 0xff])
        let set = try responder.send("GET", "/token")
        #expect(set.status == 200)
        #expect(set.body == utf8(#"{"token":"000fa0ff"}"#))
        #expect(set.headers["Content-Type"] == jsonType)
        #expect(set.headers["Cache-Control"] == "no-cache")
        #expect(set.headers["ETag"] != empty.headers["ETag"])

        _ = try responder.send("POST", "/fail")
        let cleared = try responder.send("GET", "/token")
        #expect(cleared.body == utf8(#"{"token":null}"#))
    }

    @Test("HEAD /token gives the same status and header fields as GET")
    func headToken() throws {
        let responder = makeResponder()
        for body in [nil, "a1b2c3"] as [String?] {
            if let body { _ = try responder.send("POST", "/register", body: utf8(body)) }
            let get = try responder.send("GET", "/token")
            let head = try responder.send("HEAD", "/token")
            #expect(head.status == get.status)
            #expect(head.headers.map { "\($0.name): \($0.value)" } == get.headers.map { "\($0.name): \($0.value)" })
            #expect(head.headers["Cache-Control"] == "no-cache")
            #expect(head.headers["Content-Type"] == jsonType)
        }
    }

    @Test("GET /token and GET /healthz never change state")
    func readsDoNotChangeState() throws {
        let responder = makeResponder()
        _ = responder.owner.register(deviceToken: [1, 2, 3])
        for _ in 0..<3 {
            _ = try responder.send("GET", "/token")
            _ = try responder.send("HEAD", "/token")
            _ = try responder.send("GET", "/healthz")
            _ = responder.reply("GET", "/token/stream")
            _ = try responder.send("HEAD", "/token/stream")
        }
        #expect(responder.owner.current == TokenSnapshot(version: 1, token: "010203"))
    }

    // MARK: /healthz

    @Test("/healthz: 200 ok, then 503 shutting_down after graceful shutdown begins (owner.stop())")
    func healthz() throws {
        let responder = makeResponder()
        for method in ["GET", "HEAD"] {
            let response = try responder.send(method, "/healthz")
            #expect(response.status == 200)
            #expect(response.headers["Content-Type"] == jsonType)
            #expect(response.body == utf8(#"{"status":"ok"}"#))
        }
        #expect(!responder.isStopping)

        responder.owner.stop()
        responder.owner.stop()  // idempotent
        #expect(responder.isStopping)
        for method in ["GET", "HEAD"] {
            let response = try responder.send(method, "/healthz")
            #expect(response.status == 503)
            #expect(response.headers["Content-Type"] == jsonType)
            #expect(response.body == utf8(#"{"status":"shutting_down"}"#))
        }
        // Reads still answer while stopping; writes are refused, so that no change is made after
        // every stream has had its last event, and the client is told to go elsewhere.
        #expect(try responder.send("GET", "/token").status == 200)
        for (path, body) in [("/register", "abcd"), ("/fail", "gone")] {
            let refused = try responder.send("POST", path, body: utf8(body))
            try expectError(refused, status: 503, code: "shutting_down")
            #expect(refused.headers["Retry-After"] != nil && refused.headers["Connection"] == "close")
        }
        #expect(responder.owner.current == TokenSnapshot(version: 0, token: nil))
    }

    // MARK: /token/stream

    @Test("GET /token/stream starts an event stream; HEAD answers the SSE headers")
    func streamRoute() throws {
        let responder = makeResponder()
        guard
            case .eventStream = responder.reply(
                "GET", "/token/stream",
                headers: ["Last-Event-ID": "99", "Accept": "text/event-stream"])
        else {
            Issue.record("GET /token/stream must start an event stream")
            return
        }
        let head = try responder.send("HEAD", "/token/stream")
        #expect(head.status == 200)
        #expect(head.headers["Content-Type"] == "text/event-stream")
        #expect(head.headers["Cache-Control"] == "no-cache, no-transform")
        #expect(head.headers["X-Accel-Buffering"] == "no")
        #expect(head.headers["Content-Encoding"] == nil)
        #expect(head.body.isEmpty)
        #expect(responder.owner.subscriberCount == 0, "HEAD registers no subscriber")
    }

    @Test("openEventStream: 200 with the SSE headers and a subscriber whose first event is current")
    func openEventStream() throws {
        let responder = makeResponder()
        _ = try responder.send("POST", "/register", body: utf8("beef"))
        let wakes = Counter()
        let (head, subscriber) = responder.openEventStream { wakes.increment() }
        #expect(head.status == 200)
        #expect(head.headers["Content-Type"] == "text/event-stream")
        #expect(head.headers["Cache-Control"] == "no-cache, no-transform")
        #expect(head.headers["X-Accel-Buffering"] == "no")
        #expect(head.headers["Content-Encoding"] == nil)
        let stream = try #require(subscriber)
        #expect(responder.owner.subscriberCount == 1)
        let first = drain(stream)
        #expect(string(first.bytes) == expectedEvent(1, "beef"))
        #expect(first.result == .suspended)
        #expect(wakes.value == 0)
    }

    @Test("openEventStream at maxSubscribers: 503 too_many_subscribers with Retry-After")
    func tooManySubscribers() throws {
        let responder = makeResponder(maxSubscribers: 2)
        let first = try #require(responder.openEventStream {}.1)
        _ = try #require(responder.openEventStream {}.1)

        let (refused, none) = responder.openEventStream {}
        #expect(none == nil)
        try expectError(refused, status: 503, code: "too_many_subscribers")
        let retryAfter = try #require(refused.headers["Retry-After"])
        #expect((Int(retryAfter) ?? 0) > 0, "Retry-After must be delay-seconds: \(retryAfter)")
        #expect(responder.owner.subscriberCount == 2)

        // Plain requests are never refused because of subscribers.
        #expect(try responder.send("GET", "/token").status == 200)
        #expect(try responder.send("GET", "/healthz").status == 200)
        try expectChange(try responder.send("POST", "/register", body: utf8("0a0b")), token: "0a0b", changed: true)
        guard case .eventStream = responder.reply("GET", "/token/stream") else {
            Issue.record("the route still answers .eventStream; the refusal comes from openEventStream")
            return
        }

        // A freed place can be taken again.
        responder.owner.unsubscribe(first.id)
        let (again, subscriber) = responder.openEventStream {}
        #expect(again.status == 200)
        #expect(subscriber != nil)
    }

    @Test("openEventStream after owner.stop(): 503, and open streams end cleanly")
    func streamAfterShutdown() throws {
        let responder = makeResponder()
        let wakes = Counter()
        let open = try #require(responder.openEventStream { wakes.increment() }.1)
        #expect(drain(open).result == .suspended)

        responder.owner.stop()
        #expect(wakes.value == 1, "the suspended stream is woken to end")
        #expect(drain(open).result == .endOfStream)

        let (refused, none) = responder.openEventStream {}
        #expect(none == nil)
        #expect(refused.status == 503)
        #expect(refused.headers["Content-Type"] == jsonType)
        let object = try jsonObject(refused.body)
        #expect(Set(object.keys) == ["error", "message"])
        #expect((object["message"] as? String)?.isEmpty == false)
        #expect(responder.owner.subscriberCount == 1, "the refused stream is not registered")
    }

    // MARK: 413

    @Test("payloadTooLarge: 413 payload_too_large")
    func payloadTooLarge() throws {
        let response = EngineAnswers.payloadTooLarge(limit: 4096)
        let message = try expectError(response, status: 413, code: "payload_too_large")
        #expect(message.contains("4096"))
    }
}
