import ServerSupport
import Testing

@testable import MicroHTTPDServer

/// The names one pass over a request's records keeps (`HeadFieldCapture`) match as libmicrohttpd's
/// `MHD_lookup_connection_value` does: same length, ASCII case-insensitively, header fields apart
/// from query arguments, the first record winning (`CapturedFields`).
@Suite struct HeadFieldCaptureTests {
    /// The slot `capture` finds for the record `name`.
    func slot(_ capture: HeadFieldCapture, _ name: String, argument: Bool = false) -> Int? {
        var bytes = Array(name.utf8CString.dropLast())
        return bytes.withUnsafeMutableBufferPointer { buffer in
            capture.slot(of: buffer.baseAddress!, count: buffer.count, isArgument: argument)
        }
    }

    @Test("the engine's three fields first, then the application's, each name once")
    func slots() {
        let capture = HeadFieldCapture(
            headerFields: ["Content-Type", "origin", "X-A"], queryParameters: ["q", "origin"])
        #expect(capture.contentLength == 0 && capture.transferEncoding == 1 && capture.origin == 2)
        #expect(capture.headerSlots == [3, 2, 4], "origin is the engine's Origin, in any case")
        #expect(capture.parameterSlots == [5, 6], "a query parameter named origin is not the header field")
    }

    @Test("a record matches a name of its kind and length, in any ASCII case, and nothing else")
    func matching() {
        let capture = HeadFieldCapture(
            headerFields: ["Content-Type", "Last-Event-ID"], queryParameters: ["access_token"])
        #expect(slot(capture, "Content-Type") == 3)
        #expect(slot(capture, "content-type") == 3)
        #expect(slot(capture, "CONTENT-TYPE") == 3)
        #expect(slot(capture, "last-event-id") == 4)
        #expect(slot(capture, "CONTENT-LENGTH") == 0)
        #expect(slot(capture, "Content-Typ") == nil)
        #expect(slot(capture, "Content-Types") == nil)
        #expect(slot(capture, "Content_Type") == nil)
        #expect(slot(capture, "Content\rType") == nil, "only letters fold: \\r is not -")
        #expect(slot(capture, "Content-Type", argument: true) == nil, "a query argument is not a header field")
        #expect(slot(capture, "ACCESS_TOKEN", argument: true) == 5)
        #expect(slot(capture, "access_token") == nil)
        #expect(slot(capture, "Host") == nil)
        #expect(slot(capture, "") == nil)
    }

    @Test("a record whose name holds a NUL is not the name before it (its length counts the NUL)")
    func nameWithNUL() {
        let capture = HeadFieldCapture(headerFields: ["Origin"], queryParameters: [])
        var bytes: [CChar] = Array("Origin".utf8CString.dropLast()) + [0, 0x58]
        let found = bytes.withUnsafeMutableBufferPointer {
            capture.slot(of: $0.baseAddress!, count: $0.count, isArgument: false)
        }
        #expect(found == nil)
    }

    @Test("past the capacity and at 64 bytes or more, a name gets no slot (it is looked up instead)")
    func overflow() {
        let many = (0..<20).map { "X-Field-\($0)" }
        let capture = HeadFieldCapture(headerFields: many + [String(repeating: "a", count: 64)], queryParameters: ["q"])
        let kept = capture.headerSlots.compactMap { $0 }
        #expect(kept == Array(3..<CapturedFields.capacity))
        #expect(capture.headerSlots.last! == nil)
        #expect(capture.parameterSlots == [nil])
        #expect(slot(capture, "X-Field-12") == CapturedFields.capacity - 1)
        #expect(slot(capture, "X-Field-13") == nil)
        let long = HeadFieldCapture(headerFields: [String(repeating: "b", count: 63)], queryParameters: [])
        #expect(long.headerSlots == [3])
        #expect(slot(long, String(repeating: "B", count: 63)) == 3)
    }

    @Test("the first record of a name wins, even one without a value")
    func firstWins() {
        var first: [CChar] = Array("first".utf8CString)
        var second: [CChar] = Array("second".utf8CString)
        first.withUnsafeMutableBufferPointer { first in
            second.withUnsafeMutableBufferPointer { second in
                var fields = CapturedFields()
                fields.keep(UnsafePointer(first.baseAddress!), in: 2)
                fields.keep(UnsafePointer(second.baseAddress!), in: 2)
                fields.keep(nil, in: 5)
                fields.keep(UnsafePointer(second.baseAddress!), in: 5)
                fields.keep(UnsafePointer(second.baseAddress!), in: 15)
                #expect(fields.kept(2) == UnsafePointer(first.baseAddress!))
                #expect(fields.kept(5) == nil)
                #expect(fields.kept(15) == UnsafePointer(second.baseAddress!))
                #expect(fields.kept(0) == nil)
            }
        }
    }
}
