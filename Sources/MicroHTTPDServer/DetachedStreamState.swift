import HTTPServing

/// Where one detached event stream stands (`DetachedStream`): the bytes the kernel has not taken
/// yet, whether the socket can take more, whether the source waits for a wake-up, and how the
/// stream ends. A value: the engine asks `next()` what to do, does it (a `send`, a read of the
/// source, nothing, a close), and reports the outcome back; the tests drive it as a value
/// (Tests/MicroHTTPDServerTests/DetachedStreamStateTests.swift).
///
/// The rules it keeps (issue 44, "Wanted 1"):
/// - bytes already framed are sent before the source is read again, so a partly sent event is
///   always finished first, and what the source conflates (`EventSubscriber`) is only what it has
///   not handed over yet;
/// - the clean end is the zero-size chunk, then the close; the source's `.abort` or a failed send
///   closes at once;
/// - a send the kernel did not take whole keeps the rest (`backlog`) and waits for the socket to
///   become writable; an idle stream keeps nothing (`backlog` is empty).
///
/// Thread-safety: a value type; its `DetachedStream` is only touched by its daemon's loop thread.
struct DetachedStreamState: Equatable {
    /// What the engine should do next.
    enum Action: Equatable {
        /// Send `backlog[offset...]` (`sent(_:)`, `blocked()`, `failed()`).
        case sendBacklog
        /// Read the source into the loop's buffer, frame it as a chunk and send it
        /// (`read(_:framed:)`).
        case read
        /// Nothing until a wake-up (`woken()`) or a writable socket (`writable()`).
        case wait
        /// Close the socket: `clean` after the zero-size chunk, otherwise without it.
        case close(clean: Bool)
        /// Nothing ever again: the stream is closed.
        case none
    }

    /// The framed bytes the kernel has not taken yet (the head at first; the rest of a chunk
    /// after a short send).
    private(set) var backlog: [UInt8]
    /// How many of `backlog`'s bytes were sent.
    private(set) var offset = 0
    /// Whether the last send was refused or short (`EAGAIN`): wait for `writable()`.
    private(set) var isBlocked = false
    /// Whether the source suspended itself (`EventStreamRead.suspended`): wait for `woken()`.
    private(set) var isSuspended = false
    /// Whether the zero-size chunk is framed (in the backlog, or sent).
    private(set) var isFinishing = false
    /// Whether the stream must close without a clean end.
    private(set) var isAborted = false
    /// Whether `closed()` was called.
    private(set) var isClosed = false

    /// A stream whose head (status line and fields) is `head`, not sent yet.
    init(head: [UInt8]) {
        backlog = head
    }

    /// The next thing to do.
    func next() -> Action {
        if isClosed { return .none }
        if isAborted { return .close(clean: false) }
        if offset < backlog.count { return isBlocked ? .wait : .sendBacklog }
        if isFinishing { return .close(clean: true) }
        if isSuspended { return .wait }
        return .read
    }

    /// The source's answer to a read: `framed` bytes (a chunk, the zero-size chunk, or both) were
    /// put in the loop's buffer to be sent; the caller sends them and reports with
    /// `sentFresh(_:of:rest:)`.
    /// - Returns: how many framed bytes to send (0: nothing).
    mutating func read(_ result: EventStreamRead, framedCount: Int) -> Int {
        switch result {
        case .bytes:
            break
        case .suspended:
            isSuspended = true
        case .endOfStream:
            isFinishing = true
        case .abort:
            isAborted = true
            return 0
        }
        return framedCount
    }

    /// A send of `total` fresh bytes (from the loop's buffer, not the backlog) took `count`
    /// (`count < 0`: the kernel took none, `EAGAIN`); the `rest` it did not take becomes the
    /// backlog.
    mutating func sentFresh(_ count: Int, of total: Int, rest: (Int) -> [UInt8]) {
        let taken = max(0, count)
        guard taken < total else { return }
        backlog = rest(taken)
        offset = 0
        isBlocked = true
    }

    /// A send from the backlog took `count` bytes (`count < 0`: none, `EAGAIN`).
    mutating func sentBacklog(_ count: Int) {
        guard count > 0 else {
            isBlocked = true
            return
        }
        offset += count
        if offset >= backlog.count {
            backlog = []  // an idle stream keeps no buffer
            offset = 0
        } else {
            isBlocked = true
        }
    }

    /// A send failed for good (the client has gone: `EPIPE`, `ECONNRESET`, ...).
    mutating func failed() {
        isAborted = true
    }

    /// The socket can take more bytes (`EPOLLOUT`).
    mutating func writable() {
        isBlocked = false
    }

    /// The source asked to be read again (its wake-up).
    mutating func woken() {
        isSuspended = false
    }

    /// The stream must end now, without waiting for its client (a stop's grace is over, or it
    /// stalled): closed without a clean end.
    mutating func abort() {
        isAborted = true
    }

    /// The socket was closed.
    mutating func closed() {
        isClosed = true
        backlog = []
        offset = 0
    }

    /// Whether bytes wait for the client to take them (the stall clock runs).
    var isStalled: Bool { isBlocked && offset < backlog.count }
}

/// The chunk framing of HTTP/1.1 (RFC 9112 §7.1) for the detached path, which writes its chunked
/// body itself: `size-in-hex CRLF data CRLF`, and the last chunk `0 CRLF CRLF`.
enum ChunkFraming {
    /// Room kept before the data for its size line (hex digits and CRLF): 8 bytes frame up to
    /// 16^6 - 1 bytes.
    static let prefixRoom = 8
    /// Room kept after the data: its CRLF and a zero-size chunk.
    static let suffixRoom = 2 + lastChunk.count
    /// The last chunk, with an empty trailer section.
    static let lastChunk: [UInt8] = Array("0\r\n\r\n".utf8)

    /// Frames `count` data bytes that lie at `buffer[prefixRoom..<prefixRoom + count]` in place
    /// (the size line written just before them, CRLF after), adding the last chunk after them
    /// when `last`; with `count == 0` only the last chunk (or nothing).
    /// - Returns: where the framed bytes start in `buffer`, and how many there are.
    static func frame(_ buffer: UnsafeMutableRawBufferPointer, count: Int, last: Bool) -> (start: Int, count: Int) {
        precondition(count >= 0 && prefixRoom + count + suffixRoom <= buffer.count && count < 1 << 24)
        var start = prefixRoom
        var end = prefixRoom
        if count > 0 {
            end = prefixRoom + count
            buffer[end] = 0x0D
            buffer[end + 1] = 0x0A
            end += 2
            start -= 2
            buffer[start] = 0x0D
            buffer[start + 1] = 0x0A
            var size = count
            repeat {
                start -= 1
                let digit = UInt8(size & 0xF)
                buffer[start] = digit < 10 ? 0x30 + digit : 0x61 + digit - 10
                size >>= 4
            } while size > 0
        }
        if last {
            for byte in lastChunk {
                buffer[end] = byte
                end += 1
            }
            if count == 0 { start = prefixRoom }
        }
        return (start, end - start)
    }
}
