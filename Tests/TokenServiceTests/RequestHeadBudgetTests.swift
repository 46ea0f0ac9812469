import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Issue 21 §2: the request-head budget (`--max-header-bytes`) that keeps room for every answer in
/// libmicrohttpd's connection pool.
@Suite("Request head budget")
struct RequestHeadBudgetTests {
    @Test("the default is the 8 KiB pool of earlier releases: 7,008 bytes of head, 3,056 of records")
    func defaults() {
        let budget = RequestHeadBudget()
        #expect(budget.maxHeaderBytes == 7008 && budget.poolBytes == 8192)
        #expect(budget.maxRecordBytes == 3056)
        #expect(RequestHeadBudget.maxHeaderBytesRange == 2048...15184)
        #expect(RequestHeadBudget(maxHeaderBytes: 15184).poolBytes == RequestHeadBudget.maximumPoolBytes)
    }

    @Test("out-of-range budgets are clamped to the range")
    func clamped() {
        #expect(RequestHeadBudget(maxHeaderBytes: 10).maxHeaderBytes == 2048)
        #expect(RequestHeadBudget(maxHeaderBytes: 1 << 20).maxHeaderBytes == 15184)
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
        let budget = RequestHeadBudget()
        // Two fields (Host and X-Filler): 96 bytes of records.
        #expect(budget.admits(headBytes: 7008 - 96, records: 2, cookieValueBytes: nil))
        #expect(!budget.admits(headBytes: 7008 - 95, records: 2, cookieValueBytes: nil))
        // The request: a 3,850-byte Cookie costs its bytes twice, and is over the records' half.
        #expect(!budget.admits(headBytes: 3920, records: 4, cookieValueBytes: 3850))
        #expect(budget.admits(headBytes: 3920, records: 4, cookieValueBytes: nil))
    }

    @Test("records alone are held to half the pool less the answer's reserve")
    func recordBoundary() {
        let budget = RequestHeadBudget()
        #expect(budget.admits(headBytes: 100, records: 63, cookieValueBytes: nil))  // 3,024 bytes
        #expect(!budget.admits(headBytes: 100, records: 64, cookieValueBytes: nil))  // 3,072 bytes
    }

    /// The proof in `RequestHeadBudget`'s documentation, checked for every budget and every
    /// admitted head: whatever libmicrohttpd's read buffer holds when the answer is built (half
    /// the pool, or the head plus one growth step), what is left for the answer's header block is
    /// at least `answerReserve`.
    @Test("every admitted head leaves the answer's reserve, for every budget in the range")
    func answerAlwaysFits() {
        let align = RequestHeadBudget.alignment
        func rounded(_ n: Int) -> Int { (n + align - 1) / align * align }
        for maxHeader in stride(
            from: RequestHeadBudget.maxHeaderBytesRange.lowerBound,
            through: RequestHeadBudget.maxHeaderBytesRange.upperBound, by: 97)
        {
            let budget = RequestHeadBudget(maxHeaderBytes: maxHeader)
            let pool = rounded(budget.poolBytes)  // libmicrohttpd rounds the pool up (memorypool.c)
            var worst = Int.max
            for records in 1...80 {
                for head in stride(from: 16, through: pool, by: 8)
                where budget.admits(headBytes: head, records: records, cookieValueBytes: nil) {
                    let recordBytes = records * RequestHeadBudget.recordBytes
                    // Without growth the buffer is at most half the pool (pipelined bytes after
                    // the head); with growth at most the head plus one 128-byte step.
                    let readEnd = head + 128 > pool / 2 ? rounded(head + 128) : pool / 2
                    worst = min(worst, pool - readEnd - recordBytes)
                }
            }
            #expect(worst >= RequestHeadBudget.answerReserve, "--max-header-bytes \(maxHeader): \(worst) bytes left")
        }
    }
}
