import Foundation
import HTTPServing
import ServerSupport
import Testing

@testable import TokenService

/// Issue 21 §3: the per-connection deadline for a request's head and body (`--header-timeout`),
/// as plain values with explicit instants (no clock, no sleeps).
@Suite("Request deadline")
struct RequestDeadlineTests {
    let start = ContinuousClock.now
    let timeout: Duration = .seconds(10)

    func at(_ seconds: Double) -> ContinuousClock.Instant { start + .milliseconds(Int(seconds * 1000)) }

    func check(_ deadline: inout RequestDeadline, at seconds: Double, received: Bool = false) -> RequestDeadline.Action
    {
        deadline.check(at: at(seconds), timeout: timeout) { _ in received }
    }

    @Test("a head trickled past the timeout expires from the connection's start, whatever arrives meanwhile")
    func headExpires() {
        var deadline = RequestDeadline(connectedAt: at(0))
        let outcome1 = check(&deadline, at: 9.9, received: true)
        #expect(outcome1 == .none)
        let outcome2 = check(&deadline, at: 10)
        #expect(outcome2 == .expire(body: false))
        #expect(deadline.phase == .expired)
        // Closed for reading one linger later, once.
        let outcome3 = check(&deadline, at: 10.5)
        #expect(outcome3 == .none)
        let outcome4 = check(&deadline, at: 11)
        #expect(outcome4 == .close)
        let outcome5 = check(&deadline, at: 30)
        #expect(outcome5 == .none)
        // A head completing now is not carried out.
        let outcome6 = deadline.headReceived(at: at(31), bodyExpected: false)
        #expect(!outcome6)
    }

    @Test("a body has the timeout from the end of its head; a complete one is exempt")
    func bodyExpires() {
        var deadline = RequestDeadline(connectedAt: at(0))
        let outcome7 = deadline.headReceived(at: at(8), bodyExpected: true)
        #expect(outcome7)
        let outcome8 = check(&deadline, at: 17.9)
        #expect(outcome8 == .none)
        let outcome9 = check(&deadline, at: 18)
        #expect(outcome9 == .expire(body: true))
        let outcome10 = deadline.bodyReceived()
        #expect(!outcome10)

        var finished = RequestDeadline(connectedAt: at(0))
        let outcome11 = finished.headReceived(at: at(1), bodyExpected: true)
        #expect(outcome11)
        let outcome12 = finished.bodyReceived()
        #expect(outcome12)
        #expect(finished.phase == .exempt)
        let outcome13 = check(&finished, at: 500)
        #expect(outcome13 == .none)
    }

    @Test("a request being answered, or a stream, has no deadline")
    func exemptWhileAnswered() {
        var deadline = RequestDeadline(connectedAt: at(0))
        let outcome14 = deadline.headReceived(at: at(1), bodyExpected: false)
        #expect(outcome14)
        let outcome15 = check(&deadline, at: 3600)
        #expect(outcome15 == .none)
        #expect(deadline.phase == .exempt)
    }

    @Test("a kept-alive connection has no deadline until bytes of the next request arrive")
    func keptAliveIdle() {
        var deadline = RequestDeadline(connectedAt: at(0))
        let outcome16 = deadline.headReceived(at: at(0.1), bodyExpected: false)
        #expect(outcome16)
        deadline.completed(at: at(0.2))
        #expect(deadline.phase == .idle)
        // Silent for a minute: no deadline (libmicrohttpd's idle timeout is what closes it).
        var asked: [ContinuousClock.Instant] = []
        for second in stride(from: 1.2, through: 60, by: 1.0) {
            let look = deadline.check(at: at(second), timeout: timeout) {
                asked.append($0)
                return false
            }
            #expect(look == .none)
        }
        #expect(deadline.phase == .idle)
        // Each look asks about the time since the previous one, plus the slack of the kernel's
        // receive clock: the first, about bytes after the answer's own (attack finding: the last
        // bytes of the answered request, rounded by TCP_INFO's tick, read as a new request's).
        #expect(asked.first == at(0.2) + RequestDeadline.receiveClockSlack)
        #expect(asked.dropFirst().first == at(1.2) + RequestDeadline.receiveClockSlack)
        // Bytes arrive: the head's deadline runs from that look.
        let outcome17 = check(&deadline, at: 61.2, received: true)
        #expect(outcome17 == .none)
        #expect(deadline.phase == .head)
        let outcome18 = check(&deadline, at: 71.1)
        #expect(outcome18 == .none)
        let outcome19 = check(&deadline, at: 71.2)
        #expect(outcome19 == .expire(body: false))
    }

    @Test("a look before it is due asks nothing")
    func lookNotDue() {
        var deadline = RequestDeadline(connectedAt: at(0))
        let outcome20 = deadline.headReceived(at: at(0), bodyExpected: false)
        #expect(outcome20)
        deadline.completed(at: at(1))
        var asked = false
        let look = deadline.check(at: at(1.5), timeout: timeout) { _ in
            asked = true
            return true
        }
        #expect(look == .none)
        #expect(!asked && deadline.phase == .idle)
    }

    @Test("the next request's head on a kept-alive connection ends the idle phase")
    func nextRequest() {
        var deadline = RequestDeadline(connectedAt: at(0))
        let outcome21 = deadline.headReceived(at: at(0), bodyExpected: false)
        #expect(outcome21)
        deadline.completed(at: at(1))
        let outcome22 = deadline.headReceived(at: at(5), bodyExpected: true)
        #expect(outcome22)
        #expect(deadline.phase == .body && deadline.mark == at(5))
        // An expired connection stays expired whatever else is reported.
        let outcome23 = check(&deadline, at: 15)
        #expect(outcome23 == .expire(body: true))
        deadline.completed(at: at(15.1))
        #expect(deadline.phase == .expired)
    }

    @Test("the 408 the engine writes itself is a whole HTTP/1.1 message with every field of an answer")
    func closingMessage() {
        let response = EngineAnswers.requestTimeout(seconds: 10, body: false)
        let bytes = response.closingMessage(reason: "Request Timeout", date: "Wed, 02 Dec 2026 13:00:00 GMT")
        let text = String(decoding: bytes, as: UTF8.self)
        let parts = text.components(separatedBy: "\r\n\r\n")
        #expect(parts.count == 2)
        let lines = parts[0].components(separatedBy: "\r\n")
        #expect(lines.first == "HTTP/1.1 408 Request Timeout")
        #expect(lines.contains("Date: Wed, 02 Dec 2026 13:00:00 GMT") && lines.contains("Connection: close"))
        #expect(lines.contains("Content-Type: application/json; charset=utf-8"))
        #expect(lines.contains("X-Content-Type-Options: nosniff") && lines.contains("Cache-Control: no-store"))
        #expect(lines.contains("Content-Length: \(parts[1].utf8.count)"))
        #expect(parts[1].contains("\"error\":\"request_timeout\"") && parts[1].contains("head"))
    }
}
