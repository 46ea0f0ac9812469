import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

#if canImport(Glibc)
    import Glibc
#endif

/// `GET /metrics`, `GET /` and the state file through the responder, without sockets.
@Suite struct OperabilityTests {
    @Test func metricsCountWhatHappened() throws {
        let responder = makeResponder()
        _ = try responder.send("POST", "/register", body: utf8("abcd"))
        _ = try responder.send("POST", "/register", body: utf8("abcd"))
        _ = try responder.send("POST", "/register", body: utf8("xyz"))
        _ = try responder.send("POST", "/fail", body: utf8("denied"))
        responder.metrics.recordRequest(route: .token, method: "GET", status: 200, seconds: 0.0003)
        responder.metrics.recordRequest(route: nil, method: "BREW", status: 404, seconds: 0.00001)
        let response = try responder.send("GET", "/metrics")
        #expect(response.status == 200)
        #expect(response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8")
        let text = string(response.body)
        #expect(text.contains("\nforge_push_token_token_changes_total 2\n"))
        #expect(text.contains("\nforge_push_token_registrations_accepted_total 2\n"))
        #expect(text.contains("\nforge_push_token_registrations_rejected_total 1\n"))
        #expect(text.contains("\nforge_push_token_failures_reported_total 1\n"))
        #expect(text.contains(#"forge_push_token_http_requests_total{route="/token",method="GET",status="200"} 1"#))
        #expect(text.contains(#"forge_push_token_http_requests_total{route="other",method="other",status="404"} 1"#))
        #expect(text.contains(#"forge_push_token_http_request_duration_seconds_bucket{route="/token",le="0.0005"} 1"#))
        #expect(text.contains(#"forge_push_token_http_request_duration_seconds_bucket{route="/token",le="0.00025"} 0"#))
        #expect(text.contains(#"forge_push_token_http_request_duration_seconds_count{route="/token"} 1"#))
    }

    @Test func eventCountsIncludeRemovedSubscribers() throws {
        let responder = makeResponder()
        let (_, subscriber) = responder.openEventStream(wake: {})
        let stream = try #require(subscriber)
        _ = drain(stream)  // the first event: sent
        _ = responder.owner.register(deviceToken: [1])
        _ = responder.owner.register(deviceToken: [2])
        #expect(responder.deliveries.counts == .init(sent: 1, skipped: 1))
        responder.owner.unsubscribe(stream.id)
        #expect(responder.deliveries.counts == .init(sent: 1, skipped: 1))
    }

    @Test func livePageIsHTMLThatFollowsTheStream() throws {
        let response = try makeResponder().send("GET", "/")
        #expect(response.status == 200)
        #expect(response.headers["Content-Type"] == "text/html; charset=utf-8")
        let page = string(response.body)
        #expect(page.contains(#"addEventListener("token""#))
        #expect(page.contains("EventSource.CLOSED"), "reconnects after a non-200 answer")
        #expect(!page.contains("http://") && !page.contains("https://"), "no outside assets")
    }

    @Test func stateFileRestoresTokenAndVersionAndDegradesOnFailure() throws {
        var template = Array("/tmp/fpt-op-XXXXXX".utf8CString)
        let dir = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
        let file = StateFile(path: dir + "/state.json")
        defer {
            unlink(file.path)
            rmdir(dir)
        }

        let firstStore = StateFileStore(file: file)
        let first = TokenOwner<TokenSnapshot>(store: firstStore, initial: try firstStore.load(), maxSubscribers: 4)
        #expect(first.current.version == 0)
        first.register(deviceToken: [0xab])
        first.register(deviceToken: [0xcd])
        #expect(try file.load() == .init(token: "cd", version: 2))

        let secondStore = StateFileStore(file: file)
        let second = TokenOwner<TokenSnapshot>(store: secondStore, initial: try secondStore.load(), maxSubscribers: 4)
        #expect(second.current.version == 2 && second.current.token == "cd")

        // A write that cannot be saved: 503 state_not_saved, the change refused (issue 42: not
        // served), healthz degraded, the failure logged (and its paths and errno kept out of the
        // answer).
        let lines = Locked<[String]>([])
        let log = ServerLog(minimumLevel: .info) { line in lines.withLock { $0.append(line) } }
        let responder = Responder(owner: second, log: log)
        unlink(file.path)
        rmdir(dir)
        let failed = try responder.send("POST", "/register", body: utf8("ef"))
        #expect(failed.status == 503)
        #expect(string(failed.body).contains("state_not_saved"))
        #expect(second.current.token == "cd" && second.current.version == 2)
        #expect(!string(failed.body).contains(dir))
        #expect(
            lines.withLock { $0 }.contains { $0.contains(" error ") && $0.contains(dir) && $0.contains("degraded") })
        let health = string(try responder.send("GET", "/healthz").body)
        #expect(health == #"{"reason":"state_not_saved","status":"degraded"}"#)
        // The token served, again: the file may hold another state, so it is written again, and
        // is not answered as if all were well while it cannot be.
        let retried = try responder.send("POST", "/register", body: utf8("cd"))
        #expect(retried.status == 503 && string(retried.body).contains("state_not_saved"))
        #expect(second.current.version == 2)
        mkdir(dir, 0o700)
        // Once the file can be written, the client's retry is saved, at a version above the ones
        // tried (3), and answers 200.
        let saved = try responder.send("POST", "/register", body: utf8("ef"))
        #expect(saved.status == 200 && string(saved.body) == #"{"changed":true,"token":"ef"}"#)
        #expect(try file.load() == .init(token: "ef", version: 4))
        #expect(string(try responder.send("GET", "/healthz").body) == #"{"status":"ok"}"#)
        #expect(try responder.send("POST", "/register", body: utf8("0123")).status == 200)
        #expect(string(try responder.send("GET", "/healthz").body) == #"{"status":"ok"}"#)
    }
}
