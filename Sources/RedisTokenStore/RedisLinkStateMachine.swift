import ForgePushToken
import ForgePushTokenOwner
import ServerSupport

/// The health of a replica's link to Redis, and when to ping, check and reconnect: a plain value
/// with no lock, no clock and no I/O, in the shape of swift-nio's state machines. Every event is a
/// `mutating` method taking the time (monotonic seconds) and returning the actions to carry out;
/// `RedisLink` runs it under its lock and carries the actions out after releasing it. So every
/// transition is tested as a value, without sockets (docs/replicas.md, "When something fails").
///
/// What it decides:
/// - the `redis` field of `/healthz` (`Health`) and the owner's `StoreHealth`: `.ok` when the
///   subscription is live and a check of `PREFIX:state` succeeded on it, else `.degraded` with the
///   reason once a state was read, `.starting` before;
/// - the log lines: Redis lost (warning, once per outage and reason), Redis back (info, with how
///   long it was gone), credentials refused, an invalid `PREFIX:state` (error, with the repair);
/// - when to check `PREFIX:state`: after every (re)subscribe, every `checkInterval`, after
///   another replica's change message announced a version above the replica's, and on `refresh`
///   (at most one check in flight; a subscribe or an announcement while one runs asks for one more
///   after it, not one each; at most one refresh per `refreshInterval`);
/// - whether an announced change was true: a change message is a notification, never a state
///   (docs/replicas.md, "What a replica trusts"); the read it caused either holds that state (or a
///   later one) or the message is counted as `unconfirmed`;
/// - the subscription's heartbeat: a `PING` every `heartbeatInterval`, and a reconnect when one is
///   not answered within `heartbeatTimeout`;
/// - the delivery probe: every `probeInterval` a probe published on `PREFIX:probe` through the
///   writer, which the subscription must hear within `probeTimeout`, or it is subscribed again
///   and the link is `not_delivering` until a probe is heard (a `PING` proves the connection,
///   not delivery).
///
/// Thread-safety: a value type, `Sendable`.
struct RedisLinkStateMachine: Sendable {
    /// The state of the link, as the `redis` field of `/healthz` reports it.
    enum Health: String, Sendable, Equatable {
        /// Subscribed, and the state was read on this subscription: `connected`.
        case connected
        /// Not connected (refused, timed out, hung, closed): `unreachable`.
        case unreachable
        /// Wrong password or user: `auth_failed`.
        case authFailed = "auth_failed"
        /// The TLS handshake or the verification of the server's certificate failed:
        /// `tls_failed`.
        case tlsFailed = "tls_failed"
        /// With a sentinel URL: no sentinel answers, and no master is connected:
        /// `sentinels_unreachable`.
        case sentinelsUnreachable = "sentinels_unreachable"
        /// With a sentinel URL: the sentinels name no master, or the node they name is not a
        /// master: `no_master`.
        case noMaster = "no_master"
        /// The subscription stays connected but did not hear this replica's own probe within
        /// `probeTimeout`: `not_delivering` (until a probe is heard again).
        case notDelivering = "not_delivering"
        /// Connected, but `PREFIX:state` is at 2^53 - 1, the largest version Redis keeps: every
        /// change is refused until an operator starts afresh: `version_exhausted`.
        case versionExhausted = "version_exhausted"
        /// `PREFIX:state` holds something this service did not write: `invalid_state`.
        case invalidState = "invalid_state"

        /// The health reason the owner and `/healthz` carry for it.
        var reason: HealthReason { HealthReason(rawValue: rawValue) }
    }

    /// What to do after an event.
    enum Action: Sendable, Equatable {
        /// Tell the owner the store's health changed.
        case report(StoreHealth)
        /// Write a log line.
        case log(ServerLogLevel, String)
        /// Queue one check of `PREFIX:state` on the writer (`checkSucceeded`, `checkFailed` or `checkNotQueued`
        /// must follow).
        case requestCheck
        /// Send a `PING` on the subscription.
        case ping
        /// Drop the subscription and connect again (`subscriptionFailed` follows).
        case reconnect(reason: String)
        /// Publish probe number `sequence` on `PREFIX:probe` through the writer
        /// (`probeHeard` or `probeNotSent` follows).
        case probe(sequence: UInt64)
        /// The subscription hears nothing: drop it and subscribe again at once, without counting
        /// it as a failure (`subscribed` follows; the health stays `not_delivering`).
        case resubscribe(reason: String)
        /// Count a message from Redis that changed nothing, and log `detail` (at most once per
        /// 10 s per kind: `RedisLink.ignored`).
        case ignored(RedisIgnoredMessage, detail: String)
    }

    /// The timings, in seconds.
    struct Timings: Sendable, Equatable {
        /// Between `PING`s on the subscription.
        var heartbeatInterval: Double = 1
        /// Without an answer to a `PING` before the subscription counts as lost.
        var heartbeatTimeout: Double = 3
        /// Between periodic checks of `PREFIX:state`.
        var checkInterval: Double = 2
        /// The least time between two checks asked for by `refresh` (a `Last-Event-ID` above the
        /// replica's version): 100 ms.
        var refreshInterval: Double = 0.1
        /// Between delivery probes (`--redis-probe-interval`, 5 s by default).
        var probeInterval: Double = 5
        /// Without hearing a probe before the subscription counts as not delivering: 2 s.
        var probeTimeout: Double = 2
    }

    /// Where Redis is, for log lines (never with the password).
    let endpoint: String
    /// The key prefix, for log lines.
    let prefix: String
    /// `PREFIX:state`, for the repair advice of the invalid-state log line.
    var stateKey: String { prefix + ":state" }
    /// The timings.
    let timings: Timings

    /// The link's health.
    private(set) var health: Health = .unreachable
    /// Whether a state was ever read from Redis (before that the replica knows no token).
    private(set) var stateRead = false
    /// Whether the subscription is live.
    private(set) var isSubscribed = false
    /// Whether the writer's last attempt failed (connect, send, or no reply in time); cleared by
    /// the next reply.
    private(set) var writerIsFailing = false
    /// Whether a check is queued or running.
    private(set) var checkPending = false
    private var reported: StoreHealth
    private var everConnected = false
    private var lostAt: Double?
    private var lossLogged = false
    private var lastPing = 0.0
    private var pingSent: Double?
    private var lastCheck = 0.0
    private var refreshWanted = false
    /// The probe in flight: its number and when it was asked for.
    private var probeOut: (sequence: UInt64, at: Double)?
    private var lastProbe = 0.0
    private var probeSequence: UInt64 = 0
    /// Whether a probe went unheard, and none was heard since.
    private(set) var notDelivering = false
    /// Whether the last state read from Redis is at 2^53 - 1.
    private(set) var exhausted = false
    /// What a live link that delivers is: `connected`, or `version_exhausted` at 2^53 - 1.
    private var live: Health { exhausted ? .versionExhausted : .connected }
    private var lastRefresh = -Double.infinity
    /// Whether a read of the state was asked for while one ran: one more follows it.
    private var checkAgain = false
    /// The newest state another replica's change message announced above the replica's, until a
    /// read that began after the message judged it.
    private(set) var announced: TokenState?

    /// The owner's health before the store reported anything: `.starting`, `unreachable`.
    static let healthAtStart = StoreHealth.starting(reason: Health.unreachable.reason)

    /// A link that is not connected yet.
    init(endpoint: String, prefix: String, timings: Timings = Timings()) {
        self.endpoint = endpoint
        self.prefix = prefix
        self.timings = timings
        self.reported = Self.healthAtStart
    }

    /// The owner's view of `health`: `.ok` when connected, else `.degraded` (a state was read and
    /// is served, possibly stale) or `.starting` (no state yet), with the reason.
    static func storeHealth(_ health: Health, stateRead: Bool) -> StoreHealth {
        if health == .connected { return .ok }
        return stateRead ? .degraded(reason: health.reason) : .starting(reason: health.reason)
    }

    /// Whether a write is refused at once, without queueing it: Redis is known to be down (the
    /// writer's last attempt failed and the link is not connected either). A dropped
    /// subscription alone does not stop writes: the writer's own connection may be fine.
    var refusesWrites: Bool { writerIsFailing && health != .connected }

    // MARK: The subscription

    /// The subscription is live (after `SUBSCRIBE` was confirmed): read the state on it.
    mutating func subscribed(at now: Double) -> [Action] {
        isSubscribed = true
        lastPing = now
        pingSent = nil
        lastCheck = now
        // A subscription that just went unheard is probed again at once.
        probeOut = nil
        lastProbe = notDelivering ? -Double.infinity : now
        // Subscribe-then-read: a read already running may have begun before the subscription, so
        // one more follows it.
        return checkAfterRunning()
    }

    /// The subscription could not be made, or broke: `health` (`unreachable`, `auth_failed` or
    /// `tls_failed`)
    /// says why, `detail` in words.
    mutating func subscriptionFailed(_ health: Health, detail: String, at now: Double) -> [Action] {
        isSubscribed = false
        pingSent = nil
        return become(health, detail: detail, at: now)
    }

    /// The store is stopping: the subscription ended without a failure.
    mutating func unsubscribed() {
        isSubscribed = false
        pingSent = nil
    }

    /// A `PONG` arrived on the subscription.
    mutating func pong() {
        pingSent = nil
    }

    /// Another replica's change message on `PREFIX:changes` announced `state`, whose version is
    /// above the replica's: read `PREFIX:state` (the message itself is never applied). A read
    /// already running may have begun before the change was stored, so the one that judges the
    /// announcement follows it; later messages meanwhile ask for no more reads.
    mutating func changeAnnounced(_ state: TokenState) -> [Action] {
        // The highest announcement is the one the next read judges; every announcement, higher or
        // not, asks for a read that begins after it (a running read may predate the change it
        // announces, even when a higher, forged one is waiting: attack finding).
        if announced.map({ state.version > $0.version }) ?? true { announced = state }
        return checkAfterRunning()
    }

    /// Time passed (the subscription wakes at least every 100 ms, and at the probe's deadlines): ping, give up on an unanswered
    /// ping, and ask for the periodic check and a refresh that had to wait.
    mutating func tick(at now: Double) -> [Action] {
        var actions: [Action] = []
        if isSubscribed {
            if let sent = pingSent {
                if now - sent > timings.heartbeatTimeout {
                    isSubscribed = false
                    pingSent = nil
                    let seconds = Int(timings.heartbeatTimeout)
                    return [.reconnect(reason: "no answer to PING within \(seconds) s")]
                }
            } else if now - lastPing >= timings.heartbeatInterval {
                pingSent = now
                lastPing = now
                actions.append(.ping)
            }
            if now - lastCheck >= timings.checkInterval {
                lastCheck = now
                actions += check()
            }
            if let out = probeOut {
                if now - out.at > timings.probeTimeout {
                    isSubscribed = false
                    pingSent = nil
                    probeOut = nil
                    notDelivering = true
                    let seconds = Int(timings.probeTimeout)
                    let why = "the subscription did not hear this replica's probe within \(seconds) s"
                    return become(.notDelivering, detail: why, at: now) + [.resubscribe(reason: why)]
                }
            } else if now - lastProbe >= timings.probeInterval {
                probeSequence &+= 1
                probeOut = (probeSequence, now)
                lastProbe = now
                actions.append(.probe(sequence: probeSequence))
            }
        }
        actions += refreshIfDue(at: now)
        return actions
    }

    // MARK: The delivery probe

    /// Seconds from `now` until the delivery probe needs a `tick`: until the next probe is due,
    /// or until the probe in flight has gone unheard for `probeTimeout`; at most 0 when that is
    /// now or past; `nil` while not subscribed. The subscription polls no longer than this, so a
    /// probe goes out on time and an unheard one is found on time (within one probe interval plus
    /// 2 s of the subscription going deaf, docs/replicas.md), not up to a poll later.
    func secondsUntilProbeDue(at now: Double) -> Double? {
        guard isSubscribed else { return nil }
        if let out = probeOut { return out.at + timings.probeTimeout - now }
        return lastProbe + timings.probeInterval - now
    }

    /// This replica's probe number `sequence` came back on the subscription: returns its round
    /// trip in seconds (`nil` for a probe not in flight, which changes nothing). A subscription
    /// that was not delivering is connected again.
    mutating func probeHeard(sequence: UInt64, at now: Double) -> (seconds: Double?, actions: [Action]) {
        guard let out = probeOut, out.sequence == sequence else { return (nil, []) }
        probeOut = nil
        var actions: [Action] = []
        if notDelivering {
            notDelivering = false
            if isSubscribed && health == .notDelivering && stateRead {
                actions = become(live, detail: TokenState.versionExhausted, at: now)
            } else if isSubscribed && health == .notDelivering {
                actions = check()
            }
        }
        return (now - out.at, actions)
    }

    // MARK: The version

    /// A state was read from Redis (a check, or a commit's reply); `atMaximum` when its version is
    /// 2^53 - 1. A connected link then says `version_exhausted` (and `connected` again once the
    /// state is below it).
    mutating func versionSeen(atMaximum: Bool, at now: Double) -> [Action] {
        guard atMaximum != exhausted else { return [] }
        exhausted = atMaximum
        if atMaximum && health == .connected {
            return become(.versionExhausted, detail: TokenState.versionExhausted, at: now)
        }
        if !atMaximum && health == .versionExhausted { return become(.connected, detail: "", at: now) }
        return []
    }

    /// The probe could not be published (the writer failed: that is `unreachable`, reported by
    /// the writer, not `not_delivering`).
    mutating func probeNotSent(sequence: UInt64) {
        if probeOut?.sequence == sequence { probeOut = nil }
    }

    // MARK: Checks and refreshes

    /// A subscriber's `Last-Event-ID` is above the replica's version: read the state again, but
    /// at most one check at a time and at most one refresh per `refreshInterval` (issue 21 §6: a
    /// burst of such streams costs Redis one check, not one each). A refresh that must wait is
    /// kept and asked for by a later `tick` or `checkSucceeded`. Returns `requestCheck` or nothing.
    mutating func refreshRequested(at now: Double) -> [Action] {
        refreshWanted = true
        return refreshIfDue(at: now)
    }

    /// The check could not be queued (the queue is full or the store is stopping).
    mutating func checkNotQueued() {
        checkPending = false
        checkAgain = false
    }

    /// A check read `PREFIX:state` (and reconciled it), finding `read` there: a state is known,
    /// and the link is connected when the subscription is live. A read asked for while this one
    /// ran follows; otherwise this read judges the announced change: one that `read` neither holds
    /// nor supersedes was not true, and is counted (`unconfirmed`).
    mutating func checkSucceeded(at now: Double, read: TokenState? = nil) -> [Action] {
        checkPending = false
        stateRead = true
        writerIsFailing = false
        // A subscription that went unheard stays `not_delivering` until a probe is heard.
        var actions =
            isSubscribed && !notDelivering
            ? become(live, detail: TokenState.versionExhausted, at: now) : reportIfChanged()
        if checkAgain {
            checkAgain = false
            actions += check()
        } else if let claimed = announced, let read {
            announced = nil
            if read.version < claimed.version || (read.version == claimed.version && read.token != claimed.token) {
                actions.append(
                    .ignored(
                        .unconfirmed,
                        detail: "a message on \(prefix):changes announced version \(claimed.version), but "
                            + "\(stateKey) holds version \(read.version): the message was not applied"))
            }
        }
        actions += refreshIfDue(at: now)
        return actions
    }

    /// A check failed: `health` says why (`invalid_state`, `auth_failed`, `tls_failed`,
    /// `sentinels_unreachable` and `no_master` as they are, else a connected link counts as
    /// `unreachable`).
    mutating func checkFailed(_ health: Health, detail: String, at now: Double) -> [Action] {
        checkPending = false
        // The periodic check asks again; an announcement waits for the next read that succeeds.
        checkAgain = false
        switch health {
        case .invalidState, .authFailed, .tlsFailed, .sentinelsUnreachable, .noMaster, .notDelivering:
            return become(health, detail: detail, at: now)
        case .unreachable, .connected, .versionExhausted:
            let live = self.health == .connected || self.health == .versionExhausted
            return live ? become(.unreachable, detail: "a state check failed", at: now) : []
        }
    }

    // MARK: The writer

    /// A commit's reply carried the state Redis holds: a state is known.
    mutating func stateLearned() -> [Action] {
        stateRead = true
        return reportIfChanged()
    }

    /// The writer got a reply from Redis.
    mutating func writerReplied() {
        writerIsFailing = false
    }

    /// The writer's connect, send or read failed.
    mutating func writerFailed(_ health: Health, detail: String, at now: Double) -> [Action] {
        writerIsFailing = true
        switch health {
        case .authFailed, .tlsFailed, .sentinelsUnreachable, .noMaster: return become(health, detail: detail, at: now)
        case .unreachable, .connected, .invalidState, .notDelivering, .versionExhausted: return []
        }
    }

    /// A write was refused because `PREFIX:state` is invalid.
    mutating func invalidState(detail: String, at now: Double) -> [Action] {
        become(.invalidState, detail: detail, at: now)
    }

    // MARK: Transitions

    private mutating func check() -> [Action] {
        if checkPending { return [] }
        checkPending = true
        return [.requestCheck]
    }

    /// A read that begins after now: at once when none runs, else one more after the running one.
    private mutating func checkAfterRunning() -> [Action] {
        if checkPending {
            checkAgain = true
            return []
        }
        return check()
    }

    private mutating func refreshIfDue(at now: Double) -> [Action] {
        guard refreshWanted, !checkPending, now - lastRefresh >= timings.refreshInterval else { return [] }
        refreshWanted = false
        lastRefresh = now
        return check()
    }

    private mutating func reportIfChanged() -> [Action] {
        let now = Self.storeHealth(health, stateRead: stateRead)
        guard now != reported else { return [] }
        reported = now
        return [.report(now)]
    }

    private mutating func become(_ new: Health, detail: String, at now: Double) -> [Action] {
        var actions: [Action] = []
        let old = health
        if new == .connected {
            if !everConnected {
                actions.append(.log(.info, "Redis connected at \(endpoint), key prefix \(prefix)"))
            } else if let lostAt {
                let tenths = Int(((now - lostAt) * 10).rounded())
                actions.append(.log(.info, "Redis back after \(tenths / 10).\(tenths % 10) s at \(endpoint)"))
            }
            everConnected = true
            lostAt = nil
            lossLogged = false
        } else {
            if lostAt == nil { lostAt = now }
            if !lossLogged || old != new {
                lossLogged = true
                actions.append(.log(new == .invalidState ? .error : .warning, lossLine(new, detail: detail)))
            }
        }
        health = new
        return actions + reportIfChanged()
    }

    private func lossLine(_ health: Health, detail: String) -> String {
        switch health {
        case .invalidState:
            return "Redis key \(stateKey) holds data this service did not write (\(detail)); it is never "
                + "overwritten: inspect it with HGETALL \(stateKey) and delete it (DEL \(stateKey)) so that the "
                + "replicas write their state back"
        case .authFailed:
            return "Redis at \(endpoint) refused the credentials (\(detail)); retrying in the background"
        case .tlsFailed, .sentinelsUnreachable, .noMaster:
            return "Redis at \(endpoint): \(detail); retrying in the background"
        case .notDelivering:
            return "Redis at \(endpoint): \(detail); subscribing again"
        case .versionExhausted:
            return "Redis at \(endpoint): \(detail): stop every replica, DEL \(stateKey), and start them again"
        case .unreachable, .connected:
            let when = everConnected ? "lost" : "unreachable at start"
            return "Redis \(when) at \(endpoint) (\(detail)); retrying in the background"
        }
    }
}
