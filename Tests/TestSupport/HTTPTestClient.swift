// A blocking HTTP/1.1 test client over loopback TCP, shared by the engine's tests (a fake
// application) and the service's live tests (the real one). Linux only, as the server.
#if canImport(Glibc)
    import Dispatch
    import Glibc

    /// A failure of the test client (a closed connection, a timeout, a malformed answer).
    public struct TestError: Error, CustomStringConvertible {
        public let description: String

        public init(description: String) {
            self.description = description
        }
    }

    /// One response as the test client read it: header names lowercased.
    public struct TestResponse {
        public var status: Int
        public var headers: [String: String]
        public var body: [UInt8]
        public var text: String { String(decoding: body, as: UTF8.self) }

        public init(status: Int, headers: [String: String], body: [UInt8]) {
            self.status = status
            self.headers = headers
            self.body = body
        }
    }

    /// A minimal blocking HTTP/1.1 client over a loopback TCP socket, with receive timeouts so that
    /// no test can hang.
    ///
    /// The timeout is a guard against a hang, not a deadline a test waits for (docs/testing.md,
    /// "Waiting in tests"): under Thread Sanitizer, with every suite running beside other work on
    /// two cores, an answer the service gives in milliseconds has taken seconds. A test that
    /// expects no answer makes the connection's end the next event instead (the server closes it).
    public final class TestClient {
        public let fd: Int32
        private var buffer: [UInt8] = []

        public init(port: UInt16, timeoutSeconds: Int = 60) throws {
            fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            guard fd >= 0 else { throw TestError(description: "socket failed") }
            var limit = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = port.bigEndian
            address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
            let connected = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard connected == 0 else {
                Glibc.close(fd)
                throw TestError(description: "connect failed: \(errno)")
            }
        }

        /// Whether `close()` or `reset()` ran.
        private var closed = false

        /// Closes the socket once; later calls do nothing. (A second close(2) of the number could close
        /// whatever socket took it since, such as one the in-process server just accepted, and
        /// libmicrohttpd aborts when a socket it watches is closed behind its back.)
        public func close() {
            guard !closed else { return }
            closed = true
            Glibc.close(fd)
        }

        /// Closes with RST (SO_LINGER 0), as a crashed client would; once, like `close()`.
        public func reset() {
            guard !closed else { return }
            var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
            close()
        }

        public func send(_ text: String) throws { try send(Array(text.utf8)) }

        public func send(_ bytes: [UInt8]) throws {
            var offset = 0
            while offset < bytes.count {
                let sent = bytes[offset...].withUnsafeBytes {
                    Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                }
                guard sent > 0 else { throw TestError(description: "send failed: \(errno)") }
                offset += sent
                bytesSent += sent
            }
        }

        /// Bytes this client has sent on the connection so far (`send`).
        public private(set) var bytesSent = 0

        /// Whether the server has read everything this client sent: the server's socket of this
        /// connection has received `bytesSent` bytes (`tcpi_bytes_received`) and holds none
        /// unread (its receive queue), as the kernel's socket diagnostics (sock_diag(7),
        /// `NETLINK_SOCK_DIAG`) report them for that one socket. `false` while they cannot be read.
        ///
        /// A test that sends a request in pieces waits for it after each piece
        /// (``waitUntil(_:within:sourceLocation:_:)``), so that each piece is a read of its own.
        public var serverHasReadAll: Bool {
            guard let (received, unread) = serverSocketQueues() else { return false }
            return received == UInt64(bytesSent) && unread == 0
        }

        /// The server's socket of this connection: bytes received, and bytes received but not yet
        /// read. One `SOCK_DIAG_BY_FAMILY` request for the exact socket (its four-tuple), with
        /// `INET_DIAG_INFO` (its `tcp_info`).
        private func serverSocketQueues() -> (received: UInt64, unread: UInt32)? {
            var local = sockaddr_in()
            var peer = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let named = withUnsafeMutablePointer(to: &local) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            }
            length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let peered = withUnsafeMutablePointer(to: &peer) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(fd, $0, &length) }
            }
            guard named == 0, peered == 0 else { return nil }
            // Protocol 4: NETLINK_SOCK_DIAG.
            let diag = socket(AF_NETLINK, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 4)
            guard diag >= 0 else { return nil }
            defer { Glibc.close(diag) }
            // struct nlmsghdr (16 bytes) + struct inet_diag_req_v2 (56 bytes), native byte order
            // but for the ports and addresses (network order, as in sockaddr_in).
            var request = [UInt8](repeating: 0, count: 72)
            func put32(_ value: UInt32, at offset: Int) {
                withUnsafeBytes(of: value) { request.replaceSubrange(offset..<offset + 4, with: $0) }
            }
            func put16(_ value: UInt16, at offset: Int) {
                withUnsafeBytes(of: value) { request.replaceSubrange(offset..<offset + 2, with: $0) }
            }
            put32(72, at: 0)  // nlmsg_len
            put16(20, at: 4)  // SOCK_DIAG_BY_FAMILY
            put16(1, at: 6)  // NLM_F_REQUEST
            request[16] = UInt8(AF_INET)  // sdiag_family
            request[17] = UInt8(IPPROTO_TCP)  // sdiag_protocol
            request[18] = 1 << (2 - 1)  // idiag_ext: INET_DIAG_INFO
            put32(UInt32.max, at: 20)  // idiag_states: any
            // The server's socket: its source is this client's peer, its destination this client.
            put16(peer.sin_port, at: 24)
            put16(local.sin_port, at: 26)
            put32(peer.sin_addr.s_addr, at: 28)
            put32(local.sin_addr.s_addr, at: 44)
            put32(UInt32.max, at: 64)  // idiag_cookie: INET_DIAG_NOCOOKIE
            put32(UInt32.max, at: 68)
            guard (request.withUnsafeBytes { Glibc.send(diag, $0.baseAddress, $0.count, 0) }) == 72 else { return nil }
            var reply = [UInt8](repeating: 0, count: 8192)
            let count = reply.withUnsafeMutableBytes { recv(diag, $0.baseAddress, $0.count, 0) }
            func get32(_ offset: Int) -> UInt32 {
                reply[offset..<offset + 4].withUnsafeBytes { $0.loadUnaligned(as: UInt32.self) }
            }
            // nlmsghdr, then struct inet_diag_msg (72 bytes: idiag_rqueue at 16 + 56), then rtattrs.
            guard count >= 88, reply[4] == 20 else { return nil }
            let unread = get32(16 + 56)
            var offset = 16 + 72
            while offset + 4 <= count {
                let attributeLength = Int(
                    reply[offset..<offset + 2].withUnsafeBytes { $0.loadUnaligned(as: UInt16.self) })
                let type = reply[offset + 2..<offset + 4].withUnsafeBytes { $0.loadUnaligned(as: UInt16.self) }
                guard attributeLength >= 4 else { return nil }
                // INET_DIAG_INFO: struct tcp_info, whose tcpi_bytes_received is at byte 128.
                if type == 2, attributeLength >= 4 + 136 {
                    let received = reply[offset + 4 + 128..<offset + 4 + 136].withUnsafeBytes {
                        $0.loadUnaligned(as: UInt64.self)
                    }
                    return (received, unread)
                }
                offset += (attributeLength + 3) & ~3
            }
            return nil
        }

        /// Whether bytes are there to read (buffered, or in the socket: poll(2) without waiting).
        public var hasBytesToRead: Bool {
            if !buffer.isEmpty { return true }
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            return poll(&descriptor, 1, 0) > 0
        }

        /// Sends one request and reads its response (keep-alive unless `Connection: close` is given).
        public func request(_ method: String, _ target: String, body: [UInt8] = [], headers: [String: String] = [:])
            throws
            -> TestResponse
        {
            var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            for (name, value) in headers { head += "\(name): \(value)\r\n" }
            if !body.isEmpty || method == "POST" { head += "Content-Length: \(body.count)\r\n" }
            try send(Array((head + "\r\n").utf8) + body)
            return try readResponse(method: method)
        }

        /// Reads bytes until `count` are buffered or the peer closes; `false` on close or timeout.
        private func fill(_ count: Int) -> Bool {
            var chunk = [UInt8](repeating: 0, count: 65536)
            while buffer.count < count {
                let received = recv(fd, &chunk, chunk.count, 0)
                if received <= 0 { return false }
                buffer += chunk.prefix(received)
            }
            return true
        }

        private func take(_ count: Int) -> [UInt8] {
            defer { buffer.removeFirst(count) }
            return Array(buffer.prefix(count))
        }

        /// One line without its CRLF.
        public func readLine() throws -> String {
            while true {
                if let end = buffer.firstIndex(of: 0x0A) {
                    let line = take(end + 1).dropLast()
                    return String(decoding: line.last == 0x0D ? line.dropLast() : line, as: UTF8.self)
                }
                guard fill(buffer.count + 1) else { throw TestError(description: "connection closed or timed out") }
            }
        }

        public func readHead() throws -> (Int, [String: String]) {
            let status = try readLine()
            let parts = status.split(separator: " ")
            guard parts.count >= 2, let code = Int(parts[1]) else {
                throw TestError(description: "bad status line \(status)")
            }
            var headers: [String: String] = [:]
            while true {
                let line = try readLine()
                if line.isEmpty { break }
                let pair = line.split(separator: ":", maxSplits: 1)
                headers[pair[0].lowercased()] = pair.count > 1 ? pair[1].trimmingPrefix(" ").description : ""
            }
            return (code, headers)
        }

        public func readResponse(method: String = "GET") throws -> TestResponse {
            var (status, headers) = try readHead()
            while status == 100 { (status, headers) = try readHead() }
            var body: [UInt8] = []
            // No body after HEAD, 204 or 304, whatever Content-Length says (RFC 9112 §6.3).
            if method != "HEAD" && status != 204 && status != 304 {
                if headers["transfer-encoding"]?.lowercased() == "chunked" {
                    while let chunk = try readChunk() { body += chunk }
                } else if let length = headers["content-length"].flatMap({ Int($0) }) {
                    guard fill(length) else { throw TestError(description: "body cut short") }
                    body = take(length)
                }
            }
            return TestResponse(status: status, headers: headers, body: body)
        }

        /// The next chunk of a chunked body; `nil` at the terminating zero-size chunk.
        public func readChunk() throws -> [UInt8]? {
            let sizeLine = try readLine()
            guard let size = Int(sizeLine.split(separator: ";")[0], radix: 16) else {
                throw TestError(description: "bad chunk size \(sizeLine)")
            }
            guard fill(size + 2) else { throw TestError(description: "chunk cut short") }
            let data = take(size)
            _ = take(2)
            if size == 0 { return nil }
            return data
        }

        /// Reads stream chunks until `text` has appeared in what was read since the call began.
        ///
        /// Bounded by `waitBoundSeconds` in all, not only by the socket's receive timeout, which
        /// each chunk (a heartbeat) starts again: a stream that never carries `text` fails the
        /// test instead of being read forever.
        /// - Returns: everything read.
        /// - Throws: `TestError` when the stream ends, times out or runs past the bound first.
        public func readStream(until text: String) throws -> String {
            var seen: [UInt8] = []
            let needle = Array(text.utf8)
            let deadline = DispatchTime.now().uptimeNanoseconds + UInt64(waitBoundSeconds * 1e9)
            while true {
                guard DispatchTime.now().uptimeNanoseconds < deadline else {
                    throw TestError(
                        description:
                            "waited \(Int(waitBoundSeconds)) s (waitBoundSeconds) for \(text.debugDescription) "
                            + "in the stream, in vain; read \(String(decoding: seen.suffix(500), as: UTF8.self))")
                }
                guard let chunk = try readChunk() else {
                    throw TestError(
                        description: "stream ended; read \(String(decoding: seen.suffix(500), as: UTF8.self))")
                }
                seen += chunk
                // Only the bytes that could hold a new match: the chunk and the needle's length before it.
                let tail = String(decoding: seen.suffix(chunk.count + needle.count), as: UTF8.self)
                if tail.contains(text) { return String(decoding: seen, as: UTF8.self) }
            }
        }
    }

    /// The resident set size of this process in bytes (from /proc/self/statm).
    public func residentBytes() -> Int {
        guard let file = fopen("/proc/self/statm", "r") else { return 0 }
        defer { fclose(file) }
        var size = 0
        var resident = 0
        withUnsafeMutablePointer(to: &size) { s in
            withUnsafeMutablePointer(to: &resident) { r in
                _ = withVaList([s, r]) { vfscanf(file, "%ld %ld", $0) }
            }
        }
        return resident * Int(sysconf(Int32(_SC_PAGESIZE)))
    }
#endif
