import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Issue 21 §5: the framing that libmicrohttpd lets through and the service refuses, as plain
/// values.
@Suite("Request framing")
struct RequestFramingTests {
    @Test("a target may not hold a space, tab, CR, LF, DEL or other control character")
    func targetBytes() {
        for byte in [0x00, 0x09, 0x0A, 0x0D, 0x1F, 0x20, 0x7F] as [UInt8] {
            #expect(!RequestFraming.isAllowedInTarget(byte), "\(byte)")
        }
        for byte in Array("/token?a=%20&b=~".utf8) + [0x80, 0xFF] {
            #expect(RequestFraming.isAllowedInTarget(byte), "\(byte)")
        }
    }

    @Test("a request line is method, one space, target, one space, version, and CRLF or LF")
    func requestLine() {
        #expect(RequestFraming.requestLineIsWellFormed(methodLength: 3, bytesBeforeTarget: 4, bytesAfterVersion: 2))
        #expect(RequestFraming.requestLineIsWellFormed(methodLength: 3, bytesBeforeTarget: 4, bytesAfterVersion: 1))
        #expect(RequestFraming.requestLineIsWellFormed(methodLength: 4, bytesBeforeTarget: 5, bytesAfterVersion: nil))
        // GET  /token: two spaces before the target.
        #expect(!RequestFraming.requestLineIsWellFormed(methodLength: 3, bytesBeforeTarget: 5, bytesAfterVersion: 2))
        // GET /token HTTP/1.1 + space + CRLF.
        #expect(!RequestFraming.requestLineIsWellFormed(methodLength: 3, bytesBeforeTarget: 4, bytesAfterVersion: 3))
    }

    @Test("each finding is refused with its status and Connection: close; a clean request is not")
    func refusals() {
        #expect(RequestFraming.refusal(RequestFraming.Facts()) == nil)
        func refused(_ change: (inout RequestFraming.Facts) -> Void) -> HTTPResponse? {
            var facts = RequestFraming.Facts()
            change(&facts)
            return RequestFraming.refusal(facts)
        }
        for (change, status) in [
            ({ $0.malformedTarget = true }, 400), ({ $0.malformedRequestLine = true }, 400), ({ $0.bareCR = 1 }, 400),
            (
                {
                    $0.isHTTP10 = true
                    $0.transferEncodings = 1
                }, 400
            ), ({ $0.unmetExpectations = 1 }, 417), ({ $0.foldedOrNUL = 1 }, 400),
        ] as [((inout RequestFraming.Facts) -> Void, Int)] {
            let response = refused(change)
            #expect(response?.status == status)
            #expect(response?.headers["Connection"] == "close")
            #expect(response?.headers["Content-Type"] == HTTPResponse.jsonContentType)
        }
        // Transfer-Encoding on HTTP/1.1 is not this check's business (framingRefusal's), nor HTTP/1.0 alone.
        #expect(refused { $0.transferEncodings = 1 } == nil)
        #expect(refused { $0.isHTTP10 = true } == nil)
        let expectation = refused { $0.unmetExpectations = 2 }
        let body = String(decoding: expectation?.body ?? [], as: UTF8.self)
        #expect(body.contains("expectation_failed"))
    }

    @Test("obs-fold or a NUL byte is refused before anything else, with a message that names it")
    func foldedOrNULFirst() {
        var facts = RequestFraming.Facts()
        facts.foldedOrNUL = 1
        facts.malformedRequestLine = true  // a folded first field also moves the request line's end
        let response = RequestFraming.refusal(facts)
        #expect(response?.status == 400)
        let body = String(decoding: response?.body ?? [], as: UTF8.self)
        #expect(body.contains("obs-fold"))
    }

    @Test("between two fields only the NULs of one line end; before the end of the head, two line ends")
    func lineEnds() {
        func isLineEnd(_ bytes: [UInt8], blankLine: Bool) -> Bool {
            bytes.withUnsafeBytes { RequestFraming.isLineEnd($0, blankLine: blankLine) }
        }
        // CRLF and a bare LF, as libmicrohttpd leaves them: two NULs, one NUL.
        #expect(isLineEnd([0, 0], blankLine: false))
        #expect(isLineEnd([0], blankLine: false))
        for count in 2...4 { #expect(isLineEnd([UInt8](repeating: 0, count: count), blankLine: true)) }
        // Nothing between, a folded line (" b" between two line ends), or the rest after a NUL.
        #expect(!isLineEnd([], blankLine: false))
        #expect(!isLineEnd([0, 0, 0x20, 0x62, 0, 0], blankLine: false))
        #expect(!isLineEnd([0, 0, 0x09, 0, 0], blankLine: false))
        #expect(!isLineEnd([0, 0x6A, 0x75, 0x6E, 0x6B, 0, 0], blankLine: false))
        #expect(!isLineEnd([0, 0, 0], blankLine: false))
        #expect(!isLineEnd([0], blankLine: true))
        #expect(!isLineEnd([0, 0, 0x20, 0, 0, 0, 0], blankLine: true))
        #expect(!isLineEnd([0, 0, 0, 0, 0], blankLine: true))
    }

    /// The counts of `fields` (name, value or `nil`), given one by one as libmicrohttpd lists them.
    func counts(_ fields: [(String, String?)], otherRecords: Int = 0) -> RequestFraming.FieldCounts {
        var counts = RequestFraming.FieldCounts()
        for (name, value) in fields {
            let nameBytes = Array(name.utf8)
            let valueBytes = value.map { Array($0.utf8) }
            nameBytes.withUnsafeBytes { name in
                if let valueBytes {
                    valueBytes.withUnsafeBytes { counts.countHeader(name: name, value: $0) }
                } else {
                    counts.countHeader(name: name, value: nil)
                }
            }
        }
        for _ in 0..<otherRecords { counts.countRecord() }
        return counts
    }

    @Test("the fields that decide framing are counted by name, ASCII case-insensitively, repeats included")
    func fieldCounts() {
        let found = counts(
            [
                ("host", "a"), ("HOST", "b"), ("Content-Length", "4"), ("content-length", "5"),
                ("Transfer-Encoding", "chunked"), ("Authorization", "Bearer a"), ("X-Other", "1"),
            ], otherRecords: 3)
        var expected = RequestFraming.FieldCounts()
        expected.host = 2
        expected.contentLength = 2
        expected.transferEncoding = 1
        expected.authorization = 1
        expected.records = 10
        #expect(found == expected)
        #expect(counts([("Hostx", "a"), ("Hos", "a")]).host == 0)
    }

    @Test("an empty name, or one with a space, tab or NUL, is malformed; a bare CR in a name or value is counted")
    func malformedNamesAndBareCR() {
        for name in ["", "Content-Length ", " Host", "X\tY", "A\u{0}B"] {
            #expect(counts([(name, "1")]).malformedNames == 1, "\(name.debugDescription)")
        }
        #expect(counts([("Content-Length ", "4")]).contentLength == 0, "not Content-Length to libmicrohttpd")
        #expect(counts([("Host", "x\rContent-Length: 43")]).bareCR == 1)
        #expect(counts([("X\rY", "1")]).bareCR == 1)
        #expect(counts([("Host", "x")]).bareCR == 0 && counts([("Host", "x")]).malformedNames == 0)
    }

    @Test("Expect: only 100-continue (any case, blanks around it) is met; no value is unmet")
    func expectations() {
        for value in ["100-continue", "100-Continue", " \t100-CONTINUE\t "] {
            #expect(counts([("Expect", value)]).unmetExpectations == 0, "\(value.debugDescription)")
        }
        for value: String? in ["", "  ", "100-continued", "200-ok", "100 -continue", nil] {
            #expect(counts([("expect", value)]).unmetExpectations == 1, "\(String(describing: value))")
        }
    }

    @Test("the first Cookie field's value length is kept, for the head budget; none without one")
    func cookie() {
        #expect(counts([("Host", "x")]).cookieValueBytes == nil)
        #expect(counts([("Cookie", "a=123"), ("cookie", "b=1234567")]).cookieValueBytes == 5)
        #expect(counts([("COOKIE", nil)]).cookieValueBytes == 0)
    }
}
