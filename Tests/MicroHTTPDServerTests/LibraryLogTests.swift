import ForgePushToken
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

    /// The hand-over's line is expected by the daemon that hands over (issue 44): one daemon's
    /// expectation does not hide another's genuine "Application reported internal error".
    @Test func handOverLinesAreExpectedPerDaemon() {
        let lines = Locked<[String]>([])
        let log = ServerLog(minimumLevel: .debug, format: .text) { line in lines.withLock { $0.append(line) } }
        let budget = Locked(LineBudget())
        let handingOver = LogBox(log: log, limiter: budget)
        let other = LogBox(log: log, limiter: budget)
        handingOver.expectHandOverLine()
        let message = "Application reported internal error, closing connection.\n"
        message.withCString { other.logLibraryMessage($0) }
        #expect(lines.withLock { $0.count } == 1, "the other daemon's genuine line is logged")
        message.withCString { handingOver.logLibraryMessage($0) }
        #expect(lines.withLock { $0.count } == 1, "the expected hand-over line is left out")
        message.withCString { handingOver.logLibraryMessage($0) }
        #expect(lines.withLock { $0.count } == 2, "only as many as were expected")
    }
}
