import ForgePushTokenTestSupport
import HTTPServing
import ServerSupport
import Testing

@testable import MicroHTTPDServer

/// Issue 42: the engine keeps every suspended write's pending answer (`ParkedResponses`) so that a
/// stopping server answers each one before libmicrohttpd stops; once closed it keeps nothing.
@Suite struct ParkedResponsesTests {
    @Test("park, unpark, close: what was parked and not taken is handed back once; after close nothing is kept")
    func lifecycle() {
        var parked = ParkedResponses()
        let (a, b, c) = (PendingResponse(), PendingResponse(), PendingResponse())
        let kept = [a, b, c].map { parked.park($0) }
        #expect(kept == [true, true, true])
        parked.unpark(b)  // its answer was taken
        #expect(parked.count == 2)
        let handed = parked.close()
        #expect(Set(handed.map(ObjectIdentifier.init)) == [ObjectIdentifier(a), ObjectIdentifier(c)])
        #expect(parked.isClosed && parked.count == 0)
        let late = parked.park(PendingResponse())
        #expect(!late, "a write parked after the stop began must be answered at once")
        let again = parked.close()
        #expect(again.isEmpty)
    }

    @Test("abandon: a parked answer is decided as 503 store_unavailable and resumed once; a decided one stays")
    func abandon() {
        let resumed = Counter()
        let pending = PendingResponse()
        #expect(pending.take(orPark: {}, resume: { resumed.increment() }) == nil)
        pending.abandon()
        pending.abandon()
        #expect(resumed.value == 1)
        let answer = pending.take(orPark: {}, resume: {})
        #expect(answer?.status == 503 && answer?.headers["Connection"] == "close")
        #expect(answer.map { String(decoding: $0.body, as: UTF8.self).contains("store_unavailable") } == true)

        let decided = PendingResponse()
        decided.fulfil(HTTPResponse(status: 200))
        decided.abandon()
        #expect(decided.takeIfReady()?.status == 200)
    }
}
