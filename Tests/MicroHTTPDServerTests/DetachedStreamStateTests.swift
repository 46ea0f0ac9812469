import HTTPServing
import Testing

@testable import MicroHTTPDServer

/// The detached stream's state machine as a value (`DetachedStreamState`), and its chunk framing.
struct DetachedStreamStateTests {
    private let head = Array("HTTP/1.1 200 OK\r\n\r\n".utf8)

    @Test("the head is sent first; a short send keeps the rest and waits for the socket, then finishes it")
    func headThenReads() {
        var state = DetachedStreamState(head: head)
        #expect(state.next() == .sendBacklog)
        state.sentBacklog(5)
        #expect(state.next() == .wait && state.isStalled)
        state.writable()
        #expect(state.next() == .sendBacklog)
        state.sentBacklog(head.count - 5)
        #expect(state.next() == .read && state.backlog.isEmpty && !state.isStalled)
    }

    @Test("a partly sent event is finished before the source is read again; a suspended source waits for its wake")
    func partlySentEventFirst() {
        var state = DetachedStreamState(head: [])
        #expect(state.next() == .read)
        #expect(state.read(.suspended, framedCount: 12) == 12)
        state.sentFresh(4, of: 12) { taken in Array(repeating: 1, count: 12 - taken) }
        #expect(state.backlog.count == 8)
        // Even woken (a newer event waits in the source), the rest of this one goes first.
        state.woken()
        #expect(state.next() == .wait)
        state.writable()
        #expect(state.next() == .sendBacklog)
        state.sentBacklog(-1)  // EAGAIN
        #expect(state.next() == .wait)
        state.writable()
        state.sentBacklog(8)
        #expect(state.next() == .read)
    }

    @Test("a suspended source with nothing framed waits, and is read again once woken")
    func suspendedWaits() {
        var state = DetachedStreamState(head: [])
        #expect(state.read(.suspended, framedCount: 0) == 0)
        #expect(state.next() == .wait && !state.isStalled)
        state.woken()
        #expect(state.next() == .read)
    }

    @Test("the clean end: the last chunk is sent whole, then the close; a short send of it waits")
    func cleanEnd() {
        var state = DetachedStreamState(head: [])
        #expect(state.read(.endOfStream, framedCount: 5) == 5)
        state.sentFresh(2, of: 5) { taken in Array(ChunkFraming.lastChunk[taken...]) }
        #expect(state.next() == .wait)
        state.writable()
        state.sentBacklog(3)
        #expect(state.next() == .close(clean: true))
        state.closed()
        #expect(state.next() == .none)
    }

    @Test("an abort closes at once; so does a failed send, a stall or a stop's grace")
    func aborts() {
        var fromSource = DetachedStreamState(head: [])
        #expect(fromSource.read(.abort, framedCount: 0) == 0)
        #expect(fromSource.next() == .close(clean: false))

        var failed = DetachedStreamState(head: head)
        failed.failed()
        #expect(failed.next() == .close(clean: false))

        var stalled = DetachedStreamState(head: head)
        stalled.sentBacklog(-1)
        #expect(stalled.isStalled)
        stalled.abort()
        #expect(stalled.next() == .close(clean: false))
    }

    @Test("chunk framing: hex size line, data, CRLF; the last chunk after it or alone")
    func framing() {
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64, alignment: 1)
        defer { buffer.deallocate() }
        func framed(_ data: String, last: Bool) -> String {
            let bytes = Array(data.utf8)
            for (index, byte) in bytes.enumerated() { buffer[ChunkFraming.prefixRoom + index] = byte }
            let (start, count) = ChunkFraming.frame(buffer, count: bytes.count, last: last)
            return String(decoding: buffer[start..<(start + count)], as: UTF8.self)
        }
        #expect(framed("data: x\n\n", last: false) == "9\r\ndata: x\n\n\r\n")
        #expect(
            framed(String(repeating: "a", count: 26), last: true) == "1a\r\n" + String(repeating: "a", count: 26)
                + "\r\n0\r\n\r\n")
        #expect(framed("", last: true) == "0\r\n\r\n")
        #expect(framed("", last: false) == "")
    }
}
