import ForgePushToken
import ForgePushTokenTestSupport
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The engine against a fake application (issue 31): each part of `HTTPApplication` carried over
/// real sockets, with no owner behind it. One at a time: they block their thread on sockets.
@Suite(.serialized) struct EngineTests {
    @Test("the cached read: answered from the cache per version, 304 for its ETag, recorded untimed")
    func cachedRead() throws {
        let live = try FakeServer()
        let client = try live.client()
        defer { client.close() }
        let first = try client.request("GET", "/token")
        #expect(first.status == 200 && first.text == "v0")
        let again = try client.request("GET", "/token")
        #expect(again.text == "v0")
        #expect(live.application.cachedReads.value == 1, "one rendering per version")
        #expect(live.application.admitted.value == 0, "the cached read never asks admit")
        let tag = try #require(first.headers["etag"])
        #expect(try client.request("GET", "/token", headers: ["If-None-Match": tag]).status == 304)
        live.application.bump()
        let next = try client.request("GET", "/token", headers: ["If-None-Match": tag])
        #expect(next.status == 200 && next.text == "v1")
        #expect(try client.request("HEAD", "/token").status == 200)
        waitUntil(#"live.finished.count == 5"#) { live.finished.count == 5 }
        let records = live.finished
        #expect(records.map(\.status) == [200, 200, 304, 200, 200])
        #expect(records.map(\.method) == ["GET", "GET", "GET", "GET", "HEAD"])
        #expect(records.allSatisfy { $0.path == "/token" && $0.microseconds == nil })
        #expect(live.labels.allSatisfy { $0 == nil }, "the engine answered them alone: unlabelled")
    }

    @Test("an ordinary request: admitted once, its body handed over whole, recorded with its duration")
    func ordinaryRequest() throws {
        let live = try FakeServer()
        let body = Array("0123456789".utf8)
        let response = try live.request("POST", "/register", body: body)
        #expect(response.status == 200 && response.body == body)
        #expect(live.application.admitted.value == 1)
        waitUntil(#"live.finished.count == 1"#) { live.finished.count == 1 }
        let record = try #require(live.finished.first)
        #expect(record.status == 200 && record.bytes == 10 && record.microseconds != nil)
        #expect(live.labels == [.echo], "the label admit gave it")
    }

    @Test("a request is recorded with its duration in microseconds, from its head to its answer")
    func durationInMicroseconds() throws {
        // On a manual clock: the request's duration is exactly the time the test moved the clock
        // between its admission and its body.
        let clock = ManualServerClock()
        let live = try FakeServer { $0.clock = .manual(clock) }
        let client = try live.client()
        defer { client.close() }
        try client.send("POST /register HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
        // The request's clock starts when the engine opens it, which admits it.
        waitUntil(#"live.application.admitted.value == 1"#) { live.application.admitted.value == 1 }
        clock.advance(by: .milliseconds(300))
        try client.send("ab")
        #expect(try client.readResponse().status == 200)
        waitUntil(#"live.finished.count == 1"#) { live.finished.count == 1 }
        #expect(live.finished.first?.microseconds == 300_000)
    }

    @Test("the head handed over: the header fields and query parameters the application reads, no others")
    func headHandedOver() throws {
        let live = try FakeServer()
        let response = try live.request(
            "POST", "/register?q=a%20b&other=1", body: [],
            headers: ["X-Echo": "yes", "X-Other": "no", "Content-Type": "text/plain"])
        #expect(response.headers["x-echo"] == "yes")
        #expect(response.headers["x-query"] == "q=a%20b", "re-encoded, the other parameter left out")
        #expect(response.headers["x-fields"] == "1", "X-Other and Content-Type are not read")
    }

    @Test("the head handed over: the first field or parameter of a name, in any case, as libmicrohttpd looks it up")
    func headFirstOfEachName() throws {
        let live = try FakeServer()
        let client = try live.client()
        defer { client.close() }
        try client.send(
            "POST /register?Q=first&q=second HTTP/1.1\r\nHost: x\r\nx-echo: first\r\nX-ECHO: second\r\n"
                + "CONTENT-length: 3\r\n\r\nabc")
        let response = try client.readResponse(method: "POST")
        #expect(response.status == 200)
        #expect(response.headers["x-echo"] == "first")
        #expect(response.headers["x-query"] == "q=first")
        #expect(response.headers["x-fields"] == "1")
        #expect(response.body == Array("abc".utf8), "the Content-Length in capitals framed the body")
    }

    @Test("the head handed over: a cookie or a query argument named like a header field is not that field")
    func cookiesAndArgumentsAreNotFields() throws {
        let live = try FakeServer()
        let response = try live.request(
            "POST", "/register?X-Echo=argument", body: [], headers: ["Cookie": "X-Echo=cookie; q=cookie"])
        #expect(response.status == 200)
        #expect(response.headers["x-echo"] == nil, "neither the cookie nor the query argument is X-Echo")
        #expect(response.headers["x-query"] == nil, "a cookie named q is not the query parameter q")
        let both = try live.request(
            "POST", "/register?q=argument", body: [], headers: ["Cookie": "X-Echo=cookie; q=cookie", "X-Echo": "field"])
        #expect(both.headers["x-echo"] == "field")
        #expect(both.headers["x-query"] == "q=argument")
    }

    @Test("the head handed over: names past the 16 the engine keeps are looked up, each of its own kind")
    func namesPastTheKeptOnes() throws {
        let live = try FakeServer(application: FakeApplication(fillerFields: 14))
        let response = try live.request(
            "POST", "/register?q=argument", body: [], headers: ["X-Echo": "field", "X-Filler-3": "x"])
        #expect(response.status == 200)
        #expect(response.headers["x-echo"] == "field", "X-Echo is the 18th name read")
        #expect(response.headers["x-query"] == "q=argument", "q, past them too, is a query argument")
        #expect(response.headers["x-fields"] == "2")
        let none = try live.request("POST", "/register", body: [], headers: ["q": "a field, not the argument"])
        #expect(none.headers["x-query"] == nil)
    }

    @Test("a chunked body on the cached read's path turns it into an ordinary request, with its limit")
    func chunkedCachedRead() throws {
        let live = try FakeServer { $0.maxBodyBytes = 4 }
        let client = try live.client()
        defer { client.close() }
        try client.send("GET /token HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n0\r\n\r\n")
        #expect(try client.readResponse().status == 413)
    }

    @Test("an answer decided later: the connection is suspended, then resumed and answered")
    func laterAnswer() throws {
        let live = try FakeServer()
        let response = try live.request("POST", "/fail", body: [])
        #expect(response.status == 202 && response.text == "later")
    }

    @Test("the engine's own refusals: 404 from admit, 414, %2F, 413, before the application is asked")
    func refusals() throws {
        let live = try FakeServer {
            $0.maxURLBytes = 64
            $0.maxBodyBytes = 4
        }
        #expect(try live.request("GET", "/nothing").status == 404)
        #expect(try live.request("GET", "/" + String(repeating: "a", count: 100)).status == 414)
        #expect(try live.request("GET", "/token%2Fstream").status == 404)
        let tooLarge = try live.request("POST", "/register", body: Array("too long".utf8))
        #expect(tooLarge.status == 413 && tooLarge.text.contains("payload_too_large"))
        #expect(live.application.admitted.value == 2, "only /nothing and the too-large write reach admit")
    }

    @Test(
        "an event stream: the source's bytes reach the client, suspended between; its departure ends it",
        arguments: [true, false])
    func eventStream(detached: Bool) throws {
        let live = try FakeServer { $0.detachesStreams = detached }
        let client = try live.client()
        try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
        let (status, headers) = try client.readHead()
        #expect(status == 200 && headers["content-type"] == "text/event-stream")
        waitUntil(#"live.application.streams.withLock { $0.count } == 1"#) {
            live.application.streams.withLock { $0.count } == 1
        }
        let stream = try #require(live.application.streams.withLock { $0.values.first })
        stream.push("data: one\n\n")
        #expect(try client.readStream(until: "data: one").contains("one"))
        stream.push("data: two\n\n")
        #expect(try client.readStream(until: "data: two").contains("two"))
        client.close()
        // The watcher sees the departure and tells the application, which ends the stream; the
        // engine frees its response and closes the source.
        waitUntil(#"live.application.departed.withLock { $0 } == [stream.id]"#) {
            live.application.departed.withLock { $0 } == [stream.id]
        }
        waitUntil(#"live.application.closedStreams.withLock { $0 } == [stream.id]"#) {
            live.application.closedStreams.withLock { $0 } == [stream.id]
        }
        waitUntil(#"live.finished.count == 1"#) { live.finished.count == 1 }
        #expect(live.finished.first?.wasStream == true)
    }

    @Test(
        "after an event stream kept in libmicrohttpd ended cleanly, the connection's next head is bound by --header-timeout again"
    )
    func streamThenSlowHead() throws {
        // A detached stream's connection is closed after its clean end instead (DetachedStreamTests).
        let clock = ManualServerClock()
        let live = try FakeServer {
            $0.headerTimeoutSeconds = 1
            $0.detachesStreams = false
            $0.clock = .manual(clock)
        }
        let client = try live.client()
        defer { client.close() }
        try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try client.readHead().0 == 200)
        waitUntil(#"live.application.streams.withLock { $0.count } == 1"#) {
            live.application.streams.withLock { $0.count } == 1
        }
        live.application.endAll()
        try waitUntil("the ended stream's last chunk") { try client.readChunk() == nil }
        // The stream's request is over and the connection kept alive: a head that never ends
        // gets the 408, not the idle timeout's silent close (issue 32's attack, sixth stop).
        try client.send("GET /token HTTP/1.1\r\nHost: x\r\n")
        // The idle connection's look asks the kernel how long its socket has been silent
        // (TCP_INFO's `tcpi_last_data_recv`, real milliseconds: that reading is not injected) and
        // counts the head as the next request's when that is less than the clock's time since
        // the answer less `RequestDeadline.receiveClockSlack`. Moving the clock 200 ms per look
        // of this wait (a millisecond of real time) puts the head seconds of the clock after the
        // answer while the kernel counts milliseconds; then the header timeout (1 s of the clock)
        // passes and the engine answers 408, recorded before it is sent.
        waitUntil("the engine to time the slow head out") {
            clock.advance(by: .milliseconds(200))
            return live.application.events.withLock { $0 }.contains(.requestTimedOut(body: false))
        }
        #expect(try client.readResponse().status == 408)
    }

    @Test("the heartbeat: the engine ticks the application every heartbeat period")
    func heartbeat() throws {
        // On a manual clock: one heartbeat per second of it (the period here), no more.
        let clock = ManualServerClock()
        let live = try FakeServer(application: FakeApplication(ticks: true)) { $0.clock = .manual(clock) }
        clock.advance(by: .seconds(1))
        waitUntil(#"live.application.heartbeats.value == 1 && live.application.seconds.value >= 1"#) {
            live.application.heartbeats.value == 1 && live.application.seconds.value >= 1
        }
        clock.advance(by: .seconds(1))
        waitUntil(#"live.application.heartbeats.value == 2"#) { live.application.heartbeats.value == 2 }
        #expect(live.application.heartbeats.value == 2)
    }

    @Test("a connection over --max-connections is refused and recorded as the engine's event")
    func connectionRefused() throws {
        let live = try FakeServer { $0.maxConnections = 1 }
        let first = try live.client()
        defer { first.close() }
        #expect(try first.request("GET", "/token").status == 200)
        let second = try live.client()
        defer { second.close() }
        waitUntil(#"live.application.events.withLock { $0 } == [.connectionRefusedTotalLimit]"#) {
            live.application.events.withLock { $0 } == [.connectionRefusedTotalLimit]
        }
    }

    @Test(
        "stop: once the application has ended its streams, the engine stops with none left", arguments: [true, false])
    func stopWithStreams(detached: Bool) throws {
        let live = try FakeServer { $0.detachesStreams = detached }
        let client = try live.client()
        defer { client.close() }
        try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
        _ = try client.readHead()
        waitUntil(#"live.application.streams.withLock { $0.count } == 1"#) {
            live.application.streams.withLock { $0.count } == 1
        }
        live.stop()
        #expect(live.application.closedStreams.withLock { $0.count } == 1)
        #expect(live.lines.withLock { $0.contains { $0.contains("stopped") } })
    }
}
