import ForgePushToken
import ForgePushTokenTestSupport
import HTTPServing
import ServerSupport
import Testing

@testable import MicroHTTPDServer

#if canImport(Glibc)
    import Glibc
#endif

/// `DetachedStreams`' writer over a socket pair, without libmicrohttpd: short sends, the backlog,
/// the stall limit and the clean end, driven by calling the loop's turn (`serve`) by hand.
@Suite(.serialized) struct DetachedStreamsTests {
    /// A source that gives `total` bytes of `x`, in reads of at most the buffer, then ends.
    final class BulkSource: HTTPEventSource {
        let id: UInt64 = 7
        private let left: Locked<Int>
        let closed = Locked(false)

        init(total: Int) { left = Locked(total) }

        func read(into buffer: UnsafeMutableRawBufferPointer, suspend: () -> Void) -> EventStreamRead {
            left.withLock { left in
                guard left > 0 else { return .endOfStream }
                let count = min(left, buffer.count)
                for index in 0..<count { buffer[index] = UInt8(ascii: "x") }
                left -= count
                return .bytes(count)
            }
        }

        func close() { closed.withLock { $0 = true } }
    }

    /// A socket pair with a small send buffer on the server's end: (server, client).
    private func socketPair() throws -> (Int32, Int32) {
        var fds: [Int32] = [-1, -1]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0, &fds) == 0 else {
            throw TestError(description: "socketpair failed: \(errno)")
        }
        var size: Int32 = 4096
        setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        return (fds[0], fds[1])
    }

    private func makeStream(fd: Int32, source: BulkSource, key: UInt64) -> DetachedStream {
        let context = RequestContext(
            method: "GET", path: "/token/stream", chunked: false, origin: nil, crossOrigin: CrossOriginPolicy(),
            limit: 4096, started: .now)
        context.status = 200
        return DetachedStream(
            key: key, fd: fd, source: source, context: context, client: nil, remote: nil,
            head: Array("HTTP/1.1 200 OK\r\n\r\n".utf8), record: { _ in })
    }

    @Test("a client that takes nothing: the rest waits in the stream's backlog, and the stall limit closes it")
    func stalledClientIsClosed() throws {
        let (server, client) = try socketPair()
        defer { close(client) }
        let ended = Locked<[UInt64]>([])
        let streams = try DetachedStreams(
            loop: try DaemonLoop(), clock: .monotonic, ended: { stream in ended.withLock { $0.append(stream.key) } })
        let source = BulkSource(total: 1 << 20)
        let stream = makeStream(fd: server, source: source, key: streams.newKey())
        streams.adopt(stream)
        streams.serve(writable: false)
        // Taken in with the send buffer the engine asks for (Linux gives twice it), so that a
        // client that reads nothing stalls instead of the kernel queueing megabytes for it.
        var size: Int32 = 0
        var length = socklen_t(MemoryLayout<Int32>.size)
        getsockopt(server, SOL_SOCKET, SO_SNDBUF, &size, &length)
        #expect(Int(size) == 2 * DetachedStreams.sendBufferBytes, "SO_SNDBUF \(size)")
        #expect(ended.withLock { $0 }.isEmpty && streams.count == 1)
        #expect(stream.state.isStalled && !stream.state.backlog.isEmpty && stream.stalledSince != nil)
        streams.closeStalled(at: .now + .seconds(60), limit: .seconds(120))
        #expect(streams.count == 1, "not stalled long enough")
        streams.closeStalled(at: .now + .seconds(121), limit: .seconds(120))
        #expect(ended.withLock { $0 } == [stream.key] && streams.count == 0)
        // Closed (its number may already be another suite's socket: not looked at again).
        #expect(stream.state.next() == .none)
    }

    @Test(
        "a client that reads: every chunk arrives whole and in order across short sends, then the last chunk and the close"
    )
    func readerGetsEverything() throws {
        let (server, client) = try socketPair()
        defer { close(client) }
        let ended = Locked<[UInt64]>([])
        let streams = try DetachedStreams(
            loop: try DaemonLoop(), clock: .monotonic, ended: { stream in ended.withLock { $0.append(stream.key) } })
        let total = 200_000
        let source = BulkSource(total: total)
        let stream = makeStream(fd: server, source: source, key: streams.newKey())
        streams.adopt(stream)
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        var writable = false
        var rounds = 0
        while true {
            rounds += 1
            // Bounded: 200 KB in reads of at most 64 KiB; each round moves at least a little.
            guard rounds < 1_000_000 else {
                Issue.record("the stream never ended: \(received.count) bytes received")
                break
            }
            streams.serve(writable: writable)
            let count = recv(client, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count == 0 { break }
            if count > 0 { received += buffer[..<count] }
            writable = true  // what the edge-triggered EPOLLOUT reports once the reader made room
        }
        #expect(ended.withLock { $0 } == [stream.key])
        let text = String(decoding: received, as: UTF8.self)
        #expect(text.hasPrefix("HTTP/1.1 200 OK\r\n\r\n") && text.hasSuffix("\r\n0\r\n\r\n"))
        // Decode the chunks: their data is exactly what the source gave.
        var body = 0
        var index = "HTTP/1.1 200 OK\r\n\r\n".utf8.count
        while let lineEnd = (index..<(received.count - 1)).first(where: {
            received[$0] == 0x0D && received[$0 + 1] == 0x0A
        }) {
            let size = try #require(Int(String(decoding: received[index..<lineEnd], as: UTF8.self), radix: 16))
            index = lineEnd + 2
            if size == 0 { break }
            #expect(received[index..<(index + size)].allSatisfy { $0 == UInt8(ascii: "x") })
            body += size
            index += size + 2
        }
        #expect(body == total && stream.bytesWritten == total)
    }
}
