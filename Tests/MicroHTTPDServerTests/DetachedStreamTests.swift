import ForgePushToken
import ForgePushTokenTestSupport
import HTTPServing
import Synchronization
import Testing

@testable import MicroHTTPDServer

#if canImport(Glibc)
    import Glibc
#endif

/// Streams handed over from libmicrohttpd to the engine's own writer (issue 44; `DetachedStream`)
/// against the fake application, over real sockets; where a behaviour holds on both paths, the
/// test runs on both (`detachesStreams` true and false). One at a time: they block their thread
/// on sockets.
@Suite(.serialized) struct DetachedStreamTests {
    /// Opens a stream and waits for the application to hold it.
    private func openStream(_ live: FakeServer, _ client: TestClient, version: String = "HTTP/1.1") throws
        -> (Int, [String: String], FakeStream)
    {
        try client.send("GET /token/stream \(version)\r\nHost: x\r\n\r\n")
        let (status, headers) = try client.readHead()
        waitUntil(#"live.application.streams.withLock { $0.count } == 1"#) {
            live.application.streams.withLock { $0.count } == 1
        }
        return (status, headers, try #require(live.application.streams.withLock { $0.values.first }))
    }

    @Test("the detached head: today's fields, Connection: close, chunked; no FIN from libmicrohttpd at the detach")
    func headAndNoFIN() throws {
        let live = try FakeServer()
        let client = try live.client()
        defer { client.close() }
        let (status, headers, stream) = try openStream(live, client)
        #expect(status == 200 && headers["content-type"] == "text/event-stream")
        #expect(headers["connection"] == "close" && headers["transfer-encoding"] == "chunked")
        #expect(headers["date"] != nil && headers["x-content-type-options"] == "nosniff")
        // libmicrohttpd closes its copy of the socket before the engine writes the head, so a FIN
        // from it (a half-close: `MHD_USE_TURBO` not covering it any more) is already here: a
        // peek would read end-of-file instead of finding nothing yet.
        var byte: UInt8 = 0
        let peeked = recv(client.fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        #expect(peeked < 0 && (errno == EAGAIN || errno == EWOULDBLOCK), "a FIN (or bytes) after the head")
        stream.push("data: one\n\n")
        #expect(try client.readStream(until: "data: one").contains("one"))
        #expect(!live.lines.withLock { $0.contains { $0.contains("Application reported internal error") } })
    }

    @Test("a clean end: the zero-size chunk, then the engine closes the connection and records the stream once")
    func cleanEndCloses() throws {
        let live = try FakeServer()
        let client = try live.client()
        defer { client.close() }
        let (_, _, stream) = try openStream(live, client)
        stream.push("data: one\n\n")
        _ = try client.readStream(until: "data: one")
        live.application.endAll()
        #expect(try client.readChunk() == nil)
        var byte: UInt8 = 0
        #expect(recv(client.fd, &byte, 1, 0) == 0, "the connection is closed after the clean end")
        waitUntil(#"live.finished.count == 1"#) { live.finished.count == 1 }
        let record = try #require(live.finished.first)
        #expect(record.wasStream && record.status == 200 && record.bytes == 11)
        #expect(live.labels == [.stream], "recorded with the label admit gave it")
        #expect(live.application.closedStreams.withLock { $0 } == [stream.id])
    }

    @Test("streams are served by the least loaded loop, whichever daemon accepted them; each gets its events")
    func balancedOverLoops() throws {
        let live = try FakeServer { $0.threads = 2 }
        var clients: [TestClient] = []
        defer { for client in clients { client.close() } }
        for opened in 1...20 {
            let client = try live.client()
            clients.append(client)
            try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try client.readHead().0 == 200)
            waitUntil("stream \(opened) held") { live.application.streams.withLock { $0.count } == opened }
            // Adopted before the hand-over returns: the loads are exact after each.
            let loads = live.server.detachedStreamLoads
            #expect(loads.count == 2 && loads.reduce(0, +) == opened && abs(loads[0] - loads[1]) <= 1, "\(loads)")
        }
        for stream in live.application.streams.withLock({ Array($0.values) }) { stream.push("data: both\n\n") }
        for client in clients { _ = try client.readStream(until: "data: both") }
        live.application.endAll()
        for client in clients { #expect(try client.readChunk() == nil) }
        waitUntil(#"live.server.detachedStreamLoads == [0, 0]"#) { live.server.detachedStreamLoads == [0, 0] }
    }

    /// Issue 44 point 4: a socket that cannot be copied (no descriptor left) gets a whole `503
    /// too_many_subscribers` with `Retry-After`; nothing stays counted, and the next stream works.
    @Test("a failed copy of the socket gets a whole 503; counts return to baseline; the next stream works")
    func failedCopyIs503() throws {
        let failing = Atomic<Bool>(true)
        let live = try FakeServer(copySocket: { fd in
            if failing.load(ordering: .relaxed) {
                errno = EMFILE
                return -1
            }
            return copyDescriptor(fd)
        })
        do {
            let client = try live.client()
            defer { client.close() }
            try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            let refused = try client.readResponse()
            #expect(refused.status == 503 && refused.headers["retry-after"] == String(handOverRetryAfterSeconds))
            #expect(refused.text.contains("too_many_subscribers"))
            #expect(refused.headers["content-length"] == String(refused.body.count), "the 503 is answered whole")
            #expect(try client.request("GET", "/").status == 204, "the connection goes on after the 503")
        }
        // The source was closed, the stream never counted, the connection's place given back.
        #expect(live.application.streams.withLock { $0.count } == 0)
        #expect(live.application.closedStreams.withLock { $0.count } == 1)
        waitUntil("the limiter back to 0 (\(live.server.limiter.openCount) open)") {
            live.server.limiter.openCount == 0 && live.server.openStreams.withLock { $0 } == 0
        }
        failing.store(false, ordering: .relaxed)
        let client = try live.client()
        defer { client.close() }
        let (status, headers, stream) = try openStream(live, client)
        #expect(status == 200 && headers["connection"] == "close")
        stream.push("data: after\n\n")
        #expect(try client.readStream(until: "data: after").contains("after"))
    }

    /// The hand-over's log line is expected per daemon: two servers handing streams over at once
    /// take none of each other's, and a genuine "Application reported internal error" (a chunked
    /// body cut off over its limit, whose handler call returns `MHD_NO`) is still logged.
    @Test("two servers detaching at once: neither logs the hand-over line; a genuine error line still appears")
    func handOverLinesPerDaemon() throws {
        let first = try FakeServer()
        let second = try FakeServer { $0.maxBodyBytes = 64 }
        let handOver = "Application reported internal error"
        var clients: [TestClient] = []
        defer { for client in clients { client.close() } }
        // Both servers' daemon threads hand streams over at the same time: the requests are all
        // sent before any answer is read.
        for _ in 0..<20 {
            for live in [first, second] {
                let client = try live.client()
                clients.append(client)
                try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            }
        }
        // A genuine line on the second server while the first hands more streams over.
        let cut = try second.client()
        defer { cut.close() }
        try cut.send("POST /register HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFF\r\n")
        for _ in 0..<20 {
            let client = try first.client()
            clients.append(client)
            try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
        }
        // Past the over-limit body's drop limit (1 MiB) the engine's handler returns `MHD_NO`.
        let block = [UInt8](repeating: UInt8(ascii: "a"), count: 65_536)
        var sent = 0
        while sent < 4 << 20, (try? cut.send(block)) != nil { sent += block.count }
        for client in clients { #expect(try client.readHead().0 == 200) }
        waitUntil("the second server logged its genuine error line") {
            second.lines.withLock { $0.contains { $0.contains(handOver) } }
        }
        waitUntil("60 streams held") {
            first.application.streams.withLock { $0.count } == 40
                && second.application.streams.withLock { $0.count } == 20
        }
        #expect(second.lines.withLock { $0.filter { $0.contains(handOver) }.count } == 1)
        #expect(!first.lines.withLock { $0.contains { $0.contains(handOver) } })
    }

    /// Issue 44: a request pipelined behind a detached stream's is never answered: the stream's
    /// `Connection: close` says so, and its connection closes at the stream's end, after the
    /// zero-size chunk, with a FIN (the unread request drained first, so no reset takes the last
    /// chunk), and the client retries it on a new connection (RFC 9112 §9.3.2). Pipelined in the
    /// same segment (libmicrohttpd has read it) and after the head (still in the socket).
    @Test(
        "a request pipelined behind a stream is not answered; the stream works and ends with a FIN",
        arguments: [
            true, false,
        ])
    func pipelinedBehindStream(sameSegment: Bool) throws {
        let live = try FakeServer()
        let client = try live.client()
        defer { client.close() }
        let pipelined = "GET /token HTTP/1.1\r\nHost: x\r\n\r\n"
        try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n" + (sameSegment ? pipelined : ""))
        let (status, headers) = try client.readHead()
        #expect(status == 200 && headers["connection"] == "close")
        if !sameSegment { try client.send(pipelined) }
        waitUntil(#"live.application.streams.withLock { $0.count } == 1"#) {
            live.application.streams.withLock { $0.count } == 1
        }
        let stream = try #require(live.application.streams.withLock { $0.values.first })
        stream.push("data: one\n\n")
        #expect(try client.readStream(until: "data: one").contains("one"))
        live.application.endAll()
        #expect(try client.readChunk() == nil, "the zero-size chunk")
        var byte: UInt8 = 0
        let received = recv(client.fd, &byte, 1, 0)
        #expect(received == 0, "a FIN after the last chunk, not a reset (\(received), errno \(errno)) or an answer")
        #expect(live.finished.count == 1 && live.finished.first?.wasStream == true, "the pipelined request never ran")
    }

    @Test("HTTP/1.0 streams stay in libmicrohttpd: a close-delimited body, no chunks")
    func http10StaysKept() throws {
        let live = try FakeServer()
        let client = try live.client()
        defer { client.close() }
        let (status, headers, stream) = try openStream(live, client, version: "HTTP/1.0")
        #expect(status == 200 && headers["transfer-encoding"] == nil)
        stream.push("data: old\n\n")
        #expect(try client.readLine() == "data: old")
    }

    @Test("a detached stream keeps its place under --max-connections until it ends", arguments: [true, false])
    func countsAgainstConnectionLimit(detached: Bool) throws {
        let live = try FakeServer {
            $0.maxConnections = 1
            $0.detachesStreams = detached
        }
        let client = try live.client()
        defer { client.close() }
        let (_, _, stream) = try openStream(live, client)
        let second = try live.client()
        defer { second.close() }
        waitUntil(#"live.application.events.withLock { $0 } == [.connectionRefusedTotalLimit]"#) {
            live.application.events.withLock { $0 } == [.connectionRefusedTotalLimit]
        }
        stream.end(abort: true)
        waitUntil(#"live.application.closedStreams.withLock { $0 } == [stream.id]"#) {
            live.application.closedStreams.withLock { $0 } == [stream.id]
        }
        client.close()
        waitUntil(#"live.server.limiter.openCount == 0"#) { live.server.limiter.openCount == 0 }
        let third = try live.client()
        defer { third.close() }
        #expect(try third.request("GET", "/token").status == 200)
    }

    /// Waits for the release itself, not for a time: the 1-second contract for 1,000 resets (issue
    /// 44) is checked against the release binary by e2e/metrics_test.py, where timing can be
    /// trusted, and the process's descriptors there too (suites running beside this one open their
    /// own here). 200, not 1,000: every suite shares this process's descriptors, and a daemon
    /// whose epoll set gets a number over `FD_SETSIZE` (1,024) cannot be started
    /// (`MHD_get_fdset2` in `DaemonLoop.start`), which 1,000 streams held here made other suites'
    /// servers fail.
    @Test(
        "200 clients reset their streams: every stream and every server socket is released", arguments: [true, false])
    func departedClients(detached: Bool) throws {
        let live = try FakeServer { $0.detachesStreams = detached }
        var clients: [TestClient] = []
        for _ in 0..<200 {
            let client = try live.client()
            try client.send("GET /token/stream HTTP/1.1\r\nHost: x\r\n\r\n")
            clients.append(client)
        }
        for client in clients { #expect(try client.readHead().0 == 200) }
        waitUntil(#"live.application.streams.withLock { $0.count } == 200"#) {
            live.application.streams.withLock { $0.count } == 200
        }
        for client in clients { client.reset() }
        waitUntil("every stream closed and every server socket released") {
            live.application.streams.withLock { $0.isEmpty } && live.server.limiter.openCount == 0
        }
        #expect(live.application.closedStreams.withLock { $0.count } == 200)
    }

    @Test("stop: a client that does not read is closed at the end of the grace period", arguments: [true, false])
    func stopClosesNonReader(detached: Bool) throws {
        let live = try FakeServer { $0.detachesStreams = detached }
        let client = try live.client()
        defer { client.close() }
        let (_, _, stream) = try openStream(live, client)
        var size: Int32 = 4096
        setsockopt(client.fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        // Far more than the socket buffers hold; the client reads none of it.
        stream.push(
            String(repeating: "data: xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\n\n", count: 200_000))
        live.stop()
        #expect(live.application.closedStreams.withLock { $0 } == [stream.id])
        if detached {
            #expect(
                live.lines.withLock { $0.contains { $0.contains("1 event streams did not take their end in time") } })
        }
        #expect(live.lines.withLock { $0.contains { $0.contains("stopped") } })
    }

    @Test("MHD_USE_TURBO: a 64 KiB body over a 4 KiB limit gets its whole 413, 1,000 times of 1,000")
    func turboKeepsRefusalsWhole() throws {
        let live = try FakeServer()
        let body = [UInt8](repeating: 0x61, count: 64 * 1024)
        var whole = 0
        for _ in 0..<1000 {
            let client = try live.client()
            defer { client.close() }
            try? client.send(
                Array("POST /register HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body)
            if let response = try? client.readResponse(), response.status == 413,
                response.text.contains("payload_too_large")
            {
                whole += 1
            }
        }
        #expect(whole == 1000)
    }
}
