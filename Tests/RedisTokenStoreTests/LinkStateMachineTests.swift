import ForgePushToken
import ForgePushTokenOwner
import ServerSupport
import Testing

@testable import RedisTokenStore

/// The link's health, logs, checks, pings and reconnects as plain values: events in, actions out,
/// no sockets and no clock (times are given).
@Suite struct LinkStateMachineTests {
    typealias Machine = RedisLinkStateMachine
    typealias Action = RedisLinkStateMachine.Action

    static func machine() -> Machine {
        Machine(endpoint: "redis://127.0.0.1:6379/0", prefix: "p")
    }

    @Test func connectsLosesAndComesBack() {
        var link = Self.machine()
        #expect(link.health == .unreachable && !link.stateRead)
        // Redis is not there at start: one warning, and the owner is still starting (no report).
        #expect(
            link.subscriptionFailed(.unreachable, detail: "refused", at: 0) == [
                .log(
                    .warning,
                    "Redis unreachable at start at redis://127.0.0.1:6379/0 (refused); retrying in the background")
            ])
        #expect(link.subscriptionFailed(.unreachable, detail: "refused", at: 0.1) == [])
        // Subscribed: the state is read on the new subscription, then the link is connected.
        #expect(link.subscribed(at: 1) == [.requestCheck])
        #expect(link.health == .unreachable)
        #expect(
            link.checkSucceeded(at: 1.1) == [
                .log(.info, "Redis connected at redis://127.0.0.1:6379/0, key prefix p"), .report(.ok),
            ])
        #expect(link.health == .connected && link.stateRead)
        // Lost: served but stale, logged once per outage.
        #expect(
            link.subscriptionFailed(.unreachable, detail: "closed", at: 10) == [
                .log(.warning, "Redis lost at redis://127.0.0.1:6379/0 (closed); retrying in the background"),
                .report(.degraded(reason: HealthReason(rawValue: "unreachable"))),
            ])
        #expect(link.subscriptionFailed(.unreachable, detail: "refused", at: 10.5) == [])
        #expect(link.subscribed(at: 12) == [.requestCheck])
        #expect(
            link.checkSucceeded(at: 12.5) == [
                .log(.info, "Redis back after 2.5 s at redis://127.0.0.1:6379/0"), .report(.ok),
            ])
        // A check that succeeds while already connected changes nothing.
        #expect(link.tick(at: 14.6).contains(.requestCheck))
        #expect(link.checkSucceeded(at: 14.7) == [])
    }

    @Test func reasonsAndTheirLogLines() {
        var link = Self.machine()
        #expect(
            link.subscriptionFailed(.authFailed, detail: "WRONGPASS", at: 0) == [
                .log(
                    .warning,
                    "Redis at redis://127.0.0.1:6379/0 refused the credentials (WRONGPASS); retrying in the background"),
                .report(.starting(reason: HealthReason(rawValue: "auth_failed"))),
            ])
        // A TLS failure is its own reason, with its own line; the same failure again says nothing.
        var tls = Self.machine()
        let detail = "TLS failed (certificate CN=r of 127.0.0.1: expired)"
        #expect(
            tls.subscriptionFailed(.tlsFailed, detail: detail, at: 0) == [
                .log(.warning, "Redis at redis://127.0.0.1:6379/0: \(detail); retrying in the background"),
                .report(.starting(reason: HealthReason(rawValue: "tls_failed"))),
            ])
        #expect(tls.writerFailed(.tlsFailed, detail: detail, at: 0.1) == [])
        #expect(tls.checkFailed(.tlsFailed, detail: detail, at: 0.2) == [])
        #expect(tls.refusesWrites)
        #expect(Machine.Health(RedisConnectionError.tlsFailed("x")) == .tlsFailed)
        #expect(Machine.Health(RedisConnectionError.sentinelsUnreachable("x")) == .sentinelsUnreachable)
        #expect(Machine.Health(RedisConnectionError.noMaster("x")) == .noMaster)
        // Sentinel reasons: the writer's own failure to find a master is the link's reason, and
        // a change of reason says so once.
        var sentinel = Self.machine()
        #expect(
            sentinel.writerFailed(.sentinelsUnreachable, detail: "no sentinel answered", at: 0).last
                == .report(.starting(reason: HealthReason(rawValue: "sentinels_unreachable"))))
        let moved = sentinel.subscriptionFailed(.noMaster, detail: "no master (x)", at: 1)
        #expect(moved.count == 2 && moved.last == .report(.starting(reason: HealthReason(rawValue: "no_master"))))
        #expect(sentinel.subscriptionFailed(.noMaster, detail: "no master (x)", at: 2) == [])
        #expect(Machine.Health(RedisConnectionError.timedOut) == .unreachable)
        var invalid = Self.machine()
        _ = invalid.subscribed(at: 0)
        let actions = invalid.invalidState(detail: "p:state is a string, not a hash", at: 0.1)
        #expect(actions.last == .report(.starting(reason: HealthReason(rawValue: "invalid_state"))))
        guard case .log(.error, let line) = actions.first else {
            Issue.record("no error line: \(actions)")
            return
        }
        #expect(line.contains("HGETALL p:state") && line.contains("DEL p:state"))
        // The check that found it fails with the same reason: nothing new is said.
        #expect(invalid.checkFailed(.invalidState, detail: "p:state is a string, not a hash", at: 0.2) == [])
        // Repaired: the next check succeeds on the live subscription.
        #expect(invalid.checkSucceeded(at: 3).contains(.report(.ok)))
    }

    @Test func aFailedCheckOnAConnectedLinkMakesItUnreachable() {
        var link = Self.machine()
        _ = link.subscribed(at: 0)
        _ = link.checkSucceeded(at: 0)
        #expect(
            link.checkFailed(.unreachable, detail: "timeout", at: 1).last
                == .report(.degraded(reason: HealthReason(rawValue: "unreachable"))))
        // Not connected: a failed check says nothing more.
        #expect(link.checkFailed(.unreachable, detail: "timeout", at: 2) == [])
    }

    @Test func heartbeatAndPeriodicChecks() {
        var link = Self.machine()
        #expect(link.tick(at: 0) == [])  // not subscribed: no ping
        _ = link.subscribed(at: 0)
        _ = link.checkSucceeded(at: 0.01)
        #expect(link.tick(at: 0.5) == [])
        #expect(link.tick(at: 1.0) == [.ping])
        #expect(link.tick(at: 1.5) == [])  // a ping is out
        link.pong()
        #expect(link.tick(at: 2.0) == [.ping, .requestCheck])
        // The check is still pending at the next interval: not asked for twice.
        #expect(link.tick(at: 4.0) == [])
        // The ping sent at 2.0 is never answered: after 3 s, reconnect.
        #expect(link.tick(at: 5.1) == [.reconnect(reason: "no answer to PING within 3 s")])
        #expect(!link.isSubscribed)
        #expect(link.tick(at: 6) == [])
    }

    /// Issue 21 §6: a burst of refreshes (streams opening with a `Last-Event-ID` above the
    /// replica's version) makes at most one check in flight and one per 100 ms.
    @Test func refreshesAreCoalesced() {
        var link = Self.machine()
        _ = link.subscribed(at: 0)
        _ = link.checkSucceeded(at: 0)
        #expect(link.refreshRequested(at: 0.2) == [.requestCheck])
        for n in 1...100 { #expect(link.refreshRequested(at: 0.2 + Double(n) * 0.0001) == []) }
        // The check ends within 100 ms of the one before: the refresh still wanted waits.
        #expect(link.checkSucceeded(at: 0.25) == [])
        #expect(link.tick(at: 0.28) == [])
        #expect(link.tick(at: 0.31) == [.requestCheck])
        #expect(link.checkSucceeded(at: 0.32) == [])
        // Nothing more was wanted.
        #expect(link.tick(at: 0.5) == [])
        // A check that cannot be queued is not pending: the next refresh asks again.
        #expect(link.refreshRequested(at: 0.6) == [.requestCheck])
        link.checkNotQueued()
        #expect(link.refreshRequested(at: 0.8) == [.requestCheck])
    }

    @Test func writesAreRefusedAtOnceOnlyWhenRedisIsKnownToBeDown() {
        var link = Self.machine()
        #expect(!link.refusesWrites)
        #expect(link.writerFailed(.unreachable, detail: "refused", at: 0) == [])
        #expect(link.refusesWrites)
        link.writerReplied()
        #expect(!link.refusesWrites)
        _ = link.subscribed(at: 1)
        _ = link.checkSucceeded(at: 1)
        // The writer's connection failed, but the link is connected: the next write is tried.
        _ = link.writerFailed(.unreachable, detail: "reset", at: 2)
        #expect(!link.refusesWrites)
        // Refused credentials on the writer are the link's reason.
        #expect(
            link.writerFailed(.authFailed, detail: "WRONGPASS", at: 3).last
                == .report(.degraded(reason: HealthReason(rawValue: "auth_failed")))
        )
        #expect(link.refusesWrites)
    }

    @Test func theDeliveryProbe() {
        var timings = Machine.Timings()
        timings.heartbeatInterval = 100
        timings.checkInterval = 100
        timings.probeInterval = 5
        var link = Machine(endpoint: "redis://127.0.0.1:6379/0", prefix: "p", timings: timings)
        #expect(link.secondsUntilProbeDue(at: 0) == nil)  // not subscribed: no probe
        _ = link.subscribed(at: 0)
        _ = link.checkSucceeded(at: 0.1)
        #expect(link.secondsUntilProbeDue(at: 4.0) == 1.0)  // the next probe
        #expect(link.tick(at: 4.9) == [])
        #expect(link.tick(at: 5.0) == [.probe(sequence: 1)])
        // Heard: its round trip, and nothing else happens.
        let heard = link.probeHeard(sequence: 1, at: 5.25)
        #expect(heard.seconds == 0.25 && heard.actions == [])
        // Another replica's number, or one not in flight: nothing.
        #expect(link.probeHeard(sequence: 7, at: 5.3).seconds == nil)
        #expect(link.tick(at: 10.0) == [.probe(sequence: 2)])
        #expect(link.secondsUntilProbeDue(at: 11.5) == 0.5)  // the probe in flight's timeout
        #expect(link.tick(at: 12.0) == [])  // exactly 2 s is not "more than"
        // Not heard within 2 s: not_delivering, one line, and a resubscribe (not a failure).
        let lost = link.tick(at: 12.1)
        let why = "the subscription did not hear this replica's probe within 2 s"
        #expect(
            lost == [
                .log(.warning, "Redis at redis://127.0.0.1:6379/0: \(why); subscribing again"),
                .report(.degraded(reason: HealthReason(rawValue: "not_delivering"))), .resubscribe(reason: why),
            ])
        #expect(link.health == .notDelivering && !link.refusesWrites)
        // Subscribed again and the state read: still not_delivering until a probe is heard, and
        // the new subscription is probed at once.
        link.unsubscribed()
        #expect(link.secondsUntilProbeDue(at: 12.15) == nil)
        #expect(link.subscribed(at: 12.2) == [.requestCheck])
        #expect(link.secondsUntilProbeDue(at: 12.2)! <= 0)  // probed again at once
        #expect(link.checkSucceeded(at: 12.3) == [])
        #expect(link.tick(at: 12.4) == [.probe(sequence: 3)])
        let back = link.probeHeard(sequence: 3, at: 12.45)
        #expect(back.actions.last == .report(.ok) && link.health == .connected)
        // A probe that could not be published is forgotten: the next one goes out on time.
        #expect(link.tick(at: 17.5) == [.probe(sequence: 4)])
        link.probeNotSent(sequence: 4)
        #expect(link.tick(at: 20) == [])
        #expect(link.tick(at: 22.5) == [.probe(sequence: 5)])
    }

    @Test func theLastVersionIsADegradedLink() {
        var link = Self.machine()
        _ = link.subscribed(at: 0)
        #expect(link.versionSeen(atMaximum: true, at: 0.05) == [])
        let first = link.checkSucceeded(at: 0.1)
        #expect(
            first.last == .report(.degraded(reason: HealthReason(rawValue: "version_exhausted")))
                && link.health == .versionExhausted)
        #expect(link.versionSeen(atMaximum: true, at: 0.2) == [])
        // Started afresh below 2^53 - 1: connected.
        #expect(link.versionSeen(atMaximum: false, at: 0.3).last == .report(.ok))
        #expect(link.health == .connected)
        // Reaching it while connected says so at once, with the repair.
        let reached = link.versionSeen(atMaximum: true, at: 0.4)
        guard case .log(.warning, let line) = reached.first else {
            Issue.record("no line: \(reached)")
            return
        }
        #expect(line.contains("2^53 - 1") && line.contains("DEL p:state"))
        #expect(reached.last == .report(.degraded(reason: HealthReason(rawValue: "version_exhausted"))))
    }

    @Test func storeHealthFromTheLink() {
        #expect(Machine.storeHealth(.connected, stateRead: true) == .ok)
        #expect(
            Machine.storeHealth(.unreachable, stateRead: true)
                == .degraded(reason: HealthReason(rawValue: "unreachable")))
        #expect(
            Machine.storeHealth(.invalidState, stateRead: false)
                == .starting(reason: HealthReason(rawValue: "invalid_state")))
        #expect(Machine.healthAtStart == .starting(reason: HealthReason(rawValue: "unreachable")))
    }
}
