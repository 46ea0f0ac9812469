import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Issue 21 §2: the request-head budget (`--max-header-bytes`) that keeps room for every answer in
/// libmicrohttpd's connection pool.
@Suite("Request head budget")
struct RequestHeadBudgetTests {
    @Test("the default is a 40 KiB pool: 36,320 bytes of head, 19,440 of records; 2,048 to 59,360")
    func defaults() {
        let budget = RequestHeadBudget()
        #expect(budget.maxHeaderBytes == 36320 && budget.poolBytes == 40960)
        #expect(budget.maxRecordBytes == 19440)
        #expect(RequestHeadBudget.maxHeaderBytesRange == 2048...59360)
        #expect(RequestHeadBudget(maxHeaderBytes: 59360).poolBytes == RequestHeadBudget.maximumPoolBytes)
        // The 8 KiB pool of earlier releases, and the largest pool of 128-byte growth steps.
        #expect(RequestHeadBudget(maxHeaderBytes: 7008).poolBytes == 8192)
        #expect(RequestHeadBudget(maxHeaderBytes: 15184).poolBytes == RequestHeadBudget.smallStepPoolBytes)
        #expect(RequestHeadBudget(maxHeaderBytes: 15185).poolBytes == 18416)
    }

    @Test("the pool grows with the budget, and is the smallest that keeps the budget")
    func poolIsSmallest() {
        var previous = 0
        for maxHeader in RequestHeadBudget.maxHeaderBytesRange {
            let pool = RequestHeadBudget(maxHeaderBytes: maxHeader).poolBytes
            #expect(pool >= previous)
            previous = pool
            if pool > RequestHeadBudget.smallStepPoolBytes {
                #expect(pool % RequestHeadBudget.alignment == 0)
                #expect(RequestHeadBudget.maxHeaderBytes(poolBytes: pool) >= maxHeader)
                #expect(RequestHeadBudget.maxHeaderBytes(poolBytes: pool - 16) < maxHeader)
            }
        }
    }

    /// Issue 44 point 5: a browser's `EventSource` request with 8 KiB of cookies (one `Cookie`
    /// field, `cookies` pairs) beside the ordinary fields of a browser.
    static func eventSourceHead(cookies: Int) -> (bytes: Int, records: Int, cookieValueBytes: Int) {
        let fields = [
            "Host: push.example.com",
            "Connection: keep-alive",
            "User-Agent: Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
                + "Chrome/131.0.0.0 Safari/537.36 Edg/131.0.0.0",
            "Accept: text/event-stream",
            "Accept-Encoding: gzip, deflate, br, zstd",
            "Accept-Language: en-GB,en-US;q=0.9,en;q=0.8,de;q=0.7",
            "Cache-Control: no-cache",
            "Origin: https://forge.example.com",
            "Referer: https://forge.example.com/projects/forge-push-token/settings/tokens?tab=stream",
            "Last-Event-ID: 18446744073709551615",
            "Sec-Fetch-Dest: empty",
            "Sec-Fetch-Mode: cors",
            "Sec-Fetch-Site: same-site",
            "sec-ch-ua: \"Chromium\";v=\"131\", \"Not_A Brand\";v=\"24\"",
            "sec-ch-ua-mobile: ?0",
            "sec-ch-ua-platform: \"Linux\"",
            "Cookie: " + String(repeating: "c", count: 8192),
        ]
        let line = "GET /token/stream?access_token=0123456789abcdef0123456789abcdef HTTP/1.1"
        let bytes = line.utf8.count + 2 + fields.reduce(0) { $0 + $1.utf8.count + 2 } + 2
        return (bytes, fields.count + 1 + cookies, 8192)
    }

    @Test("the default admits the EventSource request with 8 KiB of cookies in up to 216 pairs")
    func eightKilobytesOfCookies() {
        let budget = RequestHeadBudget()
        for cookies in [1, 100, 150, 200, 216] {
            let head = Self.eventSourceHead(cookies: cookies)
            #expect(
                budget.admits(headBytes: head.bytes, records: head.records, cookieValueBytes: head.cookieValueBytes))
        }
        #expect(Self.eventSourceHead(cookies: 0).bytes == 8940)
        let over = Self.eventSourceHead(cookies: 217)
        #expect(!budget.admits(headBytes: over.bytes, records: over.records, cookieValueBytes: over.cookieValueBytes))
        // The pool of earlier releases refused it whatever the count.
        let small = RequestHeadBudget(maxHeaderBytes: 7008)
        let head = Self.eventSourceHead(cookies: 100)
        #expect(!small.admits(headBytes: head.bytes, records: head.records, cookieValueBytes: head.cookieValueBytes))
    }

    @Test("out-of-range budgets are clamped to the range")
    func clamped() {
        #expect(RequestHeadBudget(maxHeaderBytes: 10).maxHeaderBytes == 2048)
        #expect(RequestHeadBudget(maxHeaderBytes: 1 << 20).maxHeaderBytes == 59360)
    }

    @Test("the Cookie copy is its value and a NUL, rounded up to 16 bytes; records cost 48 each")
    func recordCost() {
        #expect(RequestHeadBudget.recordBytes(records: 0, cookieValueBytes: nil) == 0)
        #expect(RequestHeadBudget.recordBytes(records: 0, cookieValueBytes: 0) == 16)
        #expect(RequestHeadBudget.recordBytes(records: 0, cookieValueBytes: 15) == 16)
        #expect(RequestHeadBudget.recordBytes(records: 0, cookieValueBytes: 16) == 32)
        #expect(RequestHeadBudget.recordBytes(records: 3, cookieValueBytes: 3850) == 144 + 3856)
    }

    @Test("a head is admitted up to the byte budget exactly, and not one byte over")
    func byteBoundary() {
        let budget = RequestHeadBudget(maxHeaderBytes: 7008)
        // Two fields (Host and X-Filler): 96 bytes of records.
        #expect(budget.admits(headBytes: 7008 - 96, records: 2, cookieValueBytes: nil))
        #expect(!budget.admits(headBytes: 7008 - 95, records: 2, cookieValueBytes: nil))
        // The request: a 3,850-byte Cookie costs its bytes twice, and is over the records' half.
        #expect(!budget.admits(headBytes: 3920, records: 4, cookieValueBytes: 3850))
        #expect(budget.admits(headBytes: 3920, records: 4, cookieValueBytes: nil))
    }

    @Test("records alone are held to half the pool less the answer's reserve")
    func recordBoundary() {
        let budget = RequestHeadBudget(maxHeaderBytes: 7008)
        #expect(budget.admits(headBytes: 100, records: 63, cookieValueBytes: nil))  // 3,024 bytes
        #expect(!budget.admits(headBytes: 100, records: 64, cookieValueBytes: nil))  // 3,072 bytes
    }

    /// The proof in `RequestHeadBudget`'s documentation, checked for budgets across the range and
    /// every admitted head, by following libmicrohttpd 0.9.75's read buffer (connection.c,
    /// `try_grow_read_buffer`): it starts at half the pool and grows by an eighth of the free space
    /// when that is at least 1 KiB (before a read that would find under 1 KiB free, so the head may
    /// end up to 1 KiB before the old end) and by 128 bytes when full. Records taken before a step
    /// only make it smaller, so all of them are counted after the last one. Whatever the buffer
    /// holds when the answer is built (half the pool, or the head and its last step), what is left
    /// for the answer's header block is at least `answerReserve`.
    @Test("every admitted head leaves the answer's reserve, for budgets across the range")
    func answerAlwaysFits() {
        let align = RequestHeadBudget.alignment
        func rounded(_ n: Int) -> Int { (n + align - 1) / align * align }
        let range = RequestHeadBudget.maxHeaderBytesRange
        for maxHeader in Array(stride(from: range.lowerBound, through: range.upperBound, by: 397)) + [
            7008, 15184, 15185, RequestHeadBudget.defaultMaxHeaderBytes, range.upperBound,
        ] {
            let budget = RequestHeadBudget(maxHeaderBytes: maxHeader)
            let pool = rounded(budget.poolBytes)  // libmicrohttpd rounds the pool up (memorypool.c)
            // The read buffer's ends: half the pool, then after each growth step.
            var steps = [(oldEnd: pool / 2, newEnd: pool / 2, large: false)]
            var end = pool / 2
            while end < pool {
                let free = pool - end
                let large = free / 8 >= RequestHeadBudget.bufferIncrement
                let step = large ? free / 8 : min(128, free)
                steps.append((end, rounded(end + step), large))
                end = rounded(end + step)
            }
            var worst = Int.max
            for records in stride(from: 1, through: 420, by: 7) {
                let recordBytes = records * RequestHeadBudget.recordBytes
                guard recordBytes <= budget.maxRecordBytes else { break }
                // The largest admitted head with these records, and where the buffer ends with it.
                let head = maxHeader - recordBytes
                guard head > 0 else { break }
                var readEnd = pool / 2
                for step in steps.dropFirst() {
                    let earliest = step.large ? step.oldEnd - RequestHeadBudget.bufferIncrement : step.oldEnd
                    if head > earliest { readEnd = max(readEnd, step.newEnd) }
                }
                worst = min(worst, pool - readEnd - recordBytes)
            }
            #expect(worst >= RequestHeadBudget.answerReserve, "--max-header-bytes \(maxHeader): \(worst) bytes left")
        }
    }
}
