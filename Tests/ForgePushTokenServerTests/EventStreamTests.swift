import ForgePushTokenOwner
import ForgePushTokenTestSupport
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import Testing

@testable import TokenService

#if canImport(Glibc)
    import Glibc
#endif

extension LiveServerTests {
    /// `GET /token/stream` over real sockets: first event, changes, heartbeats, departures, slow
    /// subscribers, limits and shutdown.
    @Suite struct EventStreamTests {
        func openStream(_ live: LiveServer) throws -> TestClient {
            let client = try live.client()
            try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n")
            let (status, headers) = try client.readHead()
            #expect(status == 200)
            #expect(headers["transfer-encoding"] == "chunked")
            #expect(headers["cache-control"] == "no-cache, no-transform")
            return client
        }

        func hex(_ index: Int) -> String { String(repeating: "0", count: 56) + String(index + 0x1000_0000, radix: 16) }

        @Test(arguments: [true, false]) func firstEventThenEveryChange(detached: Bool) throws {
            let live = try LiveServer { $0.detachesStreams = detached }
            let stream = try openStream(live)
            defer { stream.close() }
            #expect(try stream.readStream(until: "\n\n") == "id: 0\nevent: token\ndata: {\"token\":null}\n\n")
            _ = try live.request("POST", "/register", body: Array(hex(1).utf8))
            #expect(try stream.readStream(until: "\n\n") == "id: 1\nevent: token\ndata: {\"token\":\"\(hex(1))\"}\n\n")
            _ = try live.request("POST", "/fail")
            #expect(try stream.readStream(until: "\n\n") == "id: 2\nevent: token\ndata: {\"token\":null}\n\n")
        }

        /// One `Cookie` field of exactly `bytes` bytes in `pairs` `name=value` pairs joined by "; ".
        static func cookie(bytes: Int, pairs: Int) -> String {
            let valueBytes = bytes - 2 * (pairs - 1) - pairs * 5  // "; " between, "cNNN=" each
            return (0..<pairs).map { index in
                let length = valueBytes / pairs + (index < valueBytes % pairs ? 1 : 0)
                let number = String(index)
                return "c" + String(repeating: "0", count: 3 - number.count) + number + "="
                    + String(repeating: "v", count: length)
            }.joined(separator: "; ")
        }

        /// Issue 44 point 5: a browser's `EventSource` request with 8 KiB of cookies in 200 pairs,
        /// beside its ordinary fields, is accepted by the default head budget on both paths (over
        /// TLS: e2e/hardening_test.py).
        static func eventSourceRequest(cookie: String) -> String {
            let cookieFieldValue = cookie
            return "GET /token/stream HTTP/1.1\r\nHost: push.example.com\r\nConnection: keep-alive\r\n"
                + "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
                + "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0\r\nAccept: text/event-stream\r\n"
                + "Accept-Encoding: gzip, deflate, br, zstd\r\nAccept-Language: en-GB,en-US;q=0.9,en;q=0.8\r\n"
                + "Cache-Control: no-cache\r\nOrigin: https://forge.example.com\r\n"
                + "Referer: https://forge.example.com/projects/forge-push-token/settings/tokens\r\n"
                + "Last-Event-ID: 0\r\nSec-Fetch-Dest: empty\r\nSec-Fetch-Mode: cors\r\n"
                + "Sec-Fetch-Site: same-site\r\nCookie: \(cookieFieldValue)\r\n\r\n"
        }

        @Test(arguments: [true, false]) func eightKilobytesOfCookiesAreAccepted(detached: Bool) throws {
            let live = try LiveServer { $0.detachesStreams = detached }
            let cookie = Self.cookie(bytes: 8192, pairs: 200)
            #expect(cookie.utf8.count == 8192)
            let client = try live.client()
            defer { client.close() }
            try client.send(Self.eventSourceRequest(cookie: cookie))
            let (status, headers) = try client.readHead()
            #expect(status == 200 && headers["content-type"] == "text/event-stream")
            #expect((headers["connection"] == "close") == detached)
            #expect(try client.readStream(until: "\n\n") == "id: 0\nevent: token\ndata: {\"token\":null}\n\n")
            _ = try live.request("POST", "/register", body: Array(hex(1).utf8))
            #expect(try client.readStream(until: "\n\n") == "id: 1\nevent: token\ndata: {\"token\":\"\(hex(1))\"}\n\n")
        }

        /// The budget is exact: a stream request whose head costs `maxHeaderBytes` is served, one
        /// byte more gets the engine's JSON 431 (Host and X-Filler: two records, 96 bytes).
        @Test(arguments: [true, false]) func headJustOverTheBudgetIs431(detached: Bool) throws {
            let live = try LiveServer { $0.detachesStreams = detached }
            let budget = RequestHeadBudget().maxHeaderBytes
            // "GET /token/stream HTTP/1.1\r\n" 28, "Host: x\r\n" 9, "X-Filler: \r\n" 12, "\r\n" 2.
            for (extra, expected) in [(0, 200), (1, 431)] {
                let pad = String(repeating: "f", count: budget - 96 - 51 + extra)
                let client = try live.client()
                defer { client.close() }
                try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\nX-Filler: \(pad)\r\n\r\n")
                if expected == 200 {
                    #expect(try client.readHead().0 == 200)
                    _ = try client.readStream(until: "\n\n")
                } else {
                    let response = try client.readResponse()
                    #expect(response.status == 431 && response.text.contains("header_fields_too_large"))
                }
            }
        }

        @Test(arguments: [true, false]) func heartbeatWhileIdle(detached: Bool) throws {
            let clock = ManualServerClock()
            let live = try LiveServer {
                $0.heartbeatSeconds = 1
                $0.detachesStreams = detached
                $0.clock = .manual(clock)
            }
            let stream = try openStream(live)
            defer { stream.close() }
            _ = try stream.readStream(until: "\n\n")
            // A keep-alive comes next, with no change posted, once a period has passed on the
            // clock. Its real period is checked against the release binary (e2e/hardening_test.py
            // counts heartbeats per second).
            clock.advance(by: .seconds(1))
            #expect(try stream.readStream(until: ": keep-alive\n\n") == ": keep-alive\n\n")
        }

        @Test(arguments: [true, false]) func fiftySubscribersComeAndGo(detached: Bool) throws {
            let live = try LiveServer { $0.detachesStreams = detached }
            for round in 0..<2 {
                let clients = try (0..<50).map { _ in try openStream(live) }
                for client in clients { _ = try client.readStream(until: "\n\n") }
                #expect(live.owner.subscriberCount == 50)
                for (index, client) in clients.enumerated() {
                    if (index + round) % 2 == 0 { client.close() } else { client.reset() }
                }
                // Released, heartbeat or not (it is 15 s here). A release is three hand-offs: the
                // subscriber watcher's epoll wakes on the departure and aborts the subscriber, the
                // daemon loop's next run ends the stream, and a later run frees the response
                // (libmicrohttpd 0.9.75 defers that cleanup; the loop's 500 ms backstop guarantees
                // the run), whose free callback unsubscribes. Alone that takes milliseconds; with
                // every suite running in parallel under Thread Sanitizer on two cores, those
                // threads waited for a core longer than 2 s (issue 22). So this waits for the
                // release itself; the 2-second contract (docs/http-api.md) is checked against the
                // release binary by e2e/metrics_test.py.
                waitUntil(#"live.owner.subscriberCount == 0"#) { live.owner.subscriberCount == 0 }
            }
            #expect(try live.request("GET", "/healthz").status == 200)
        }

        @Test(arguments: [true, false]) func subscriberLimitIs503AndPlainRequestsStillWork(detached: Bool) throws {
            let live = try LiveServer {
                $0.maxSubscribers = 2
                $0.detachesStreams = detached
            }
            let first = try openStream(live)
            let second = try openStream(live)
            defer {
                first.close()
                second.close()
            }
            let refused = try live.request("GET", "/token/stream")
            #expect(refused.status == 503)
            #expect(refused.headers["retry-after"] != nil)
            #expect(refused.text.contains("too_many_subscribers"))
            #expect(try live.request("GET", "/token").status == 200)
            #expect(try live.request("POST", "/register", body: Array(hex(1).utf8)).status == 200)
        }

        /// A subscriber that never reads: everyone else is served, and its memory stays bounded
        /// while 10,000 changes are posted (it holds at most the newest unsent event).
        @Test(arguments: [true, false]) func subscriberThatNeverReadsCostsBoundedMemory(detached: Bool) throws {
            let live = try LiveServer { $0.detachesStreams = detached }
            let stuck = try live.client()
            defer { stuck.close() }
            var small: Int32 = 4096
            setsockopt(stuck.fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
            try stuck.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            let reader = try openStream(live)
            defer { reader.close() }
            _ = try reader.readStream(until: "\n\n")

            let writer = try live.client()
            defer { writer.close() }
            for index in 0..<2000 {
                _ = try writer.request("POST", "/register", body: Array(hex(index).utf8))
            }
            let before = residentBytes()
            for index in 2000..<10_000 {
                let response = try writer.request("POST", "/register", body: Array(hex(index).utf8))
                if response.status != 200 {
                    Issue.record("POST \(index) got \(response.status)")
                    break
                }
            }
            // What the service holds for the stuck subscriber is bounded by construction: the rest of
            // one event plus one pending event, whatever the number of changes (EventSubscriberTests
            // proves that bound on the subscriber itself).
            // And the process as a whole did not grow by anything like a queue of 8,000 events per
            // subscriber (a loose bound: other test suites run in this process at the same time).
            #expect(residentBytes() - before < 64 << 20)
            #expect(try live.request("GET", "/token").text == #"{"token":"\#(hex(9999))"}"#)
            // The reading subscriber converges on the last value.
            _ = try reader.readStream(until: hex(9999))
        }

        @Test(arguments: [true, false]) func gracefulShutdownEndsStreamsWithTheChunkedTerminator(detached: Bool) throws
        {
            let live = try LiveServer { $0.detachesStreams = detached }
            let stream = try openStream(live)
            defer { stream.close() }
            _ = try stream.readStream(until: "\n\n")
            live.service.shutdown(engine: live.server)
            // The zero-size chunk: a clean end (how soon is the release binary's to show, in
            // e2e/state_file_test.py's SIGTERM runs; here only that it comes).
            #expect(try stream.readChunk() == nil)
            #expect(live.owner.subscriberCount == 0)
        }

        @Test(arguments: [true, false]) func departedSubscriberIsReleasedWhileSuspended(detached: Bool) throws {
            let live = try LiveServer { $0.detachesStreams = detached }
            let stream = try openStream(live)
            _ = try stream.readStream(until: "\n\n")
            // Waits for the suspension itself (the reader found nothing more to send), not for a
            // while: a reset before it would be noticed by libmicrohttpd, and prove nothing.
            waitUntil(#"suspendedSubscribers(live) == 1"#) { suspendedSubscribers(live) == 1 }
            #expect(live.owner.subscriberCount == 1)
            stream.reset()
            waitUntil(#"live.owner.subscriberCount == 0"#) { live.owner.subscriberCount == 0 }
        }
    }
}

extension LiveServerTests.EventStreamTests {
    /// How many of `live`'s subscribers have suspended their connection now (read through the
    /// owner's `finish(reason:where:)` with a predicate that picks none, so nothing ends).
    func suspendedSubscribers(_ live: LiveServer) -> Int {
        var count = 0
        live.owner.finish(reason: .drain) { subscriber in
            if (subscriber as? EventSubscriber)?.isSuspended == true { count += 1 }
            return false
        }
        return count
    }

    /// The number of open file descriptors of this process.
    func openDescriptors() -> Int {
        guard let dir = opendir("/proc/self/fd") else { return -1 }
        defer { closedir(dir) }
        var count = 0
        while readdir(dir) != nil { count += 1 }
        return count
    }

    /// Regression: with another client's idle keep-alive connection open, departed subscribers'
    /// sockets must still be closed (libmicrohttpd 0.9.75's own epoll thread could wait forever
    /// before cleaning them up).
    @Test(arguments: [true, false]) func departedSubscribersAreClosedWhileAnotherConnectionIdles(detached: Bool) throws
    {
        let live = try LiveServer { $0.detachesStreams = detached }
        let idle = try live.client()
        defer { idle.close() }
        #expect(try idle.request("GET", "/healthz").status == 200)
        let baseline = openDescriptors()
        for _ in 0..<3 {
            let clients = try (0..<50).map { _ in try openStream(live) }
            for client in clients { _ = try client.readStream(until: "\n\n") }
            for client in clients { client.close() }
            waitUntil(
                "no subscriber and the descriptors back to a baseline of \(baseline) + 2 (now \(openDescriptors()))"
            ) {
                live.owner.subscriberCount == 0 && openDescriptors() <= baseline + 2
            }
        }
    }
}
