import Testing

@testable import ForgePushTokenHTTP

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
            ), ({ $0.unmetExpectations = 1 }, 417),
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
}
