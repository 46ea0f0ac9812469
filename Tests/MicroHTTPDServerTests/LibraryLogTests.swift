import ServerSupport
import Testing

@testable import MicroHTTPDServer

/// libmicrohttpd's warnings are caused by clients, so they are limited (attack finding: 2,000
/// broken request lines wrote 2,000 log lines in 0.3 s).
@Suite struct LibraryLogTests {
    @Test func atMostTenWarningsASecondThenHowManyWereLeftOut() {
        var budget = LineBudget()
        let start = ContinuousClock.now
        var written = 0
        for _ in 0..<2_000 where budget.admit(at: start, perSecond: 10) != nil { written += 1 }
        #expect(written == 10)
        // The next second's first line says how many were left out, and the count starts again.
        #expect(budget.admit(at: start + .seconds(1), perSecond: 10) == 1_990)
        #expect(budget.admit(at: start + .milliseconds(1500), perSecond: 10) == 0)
    }
}
