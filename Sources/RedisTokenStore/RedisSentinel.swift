import Dispatch
import ForgePushToken
import GnuTLSClient
import ServerSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Finding the master through Redis Sentinel (docs/replicas.md, "Redis Sentinel" and "What a
/// replica trusts"): the master password goes only to an address a majority of the configured
/// sentinels vouch for. Every sentinel is asked in parallel
/// (`SENTINEL get-master-addr-by-name MASTER_NAME` and `SENTINEL replicas MASTER_NAME`), and the
/// answer is decided as soon as more than half of the configured sentinels name the same address
/// (`decide`), giving up after 500 ms; the connection then checks that `ROLE` says `master` (a
/// sentinel that has not seen a failover yet may name the old master). The same answers give the
/// master's replicas that a majority lists: a `+switch-master` naming one of them is trusted at
/// once (`switched(to:)`), so a failover moves the writer and the subscription without waiting
/// for the other sentinels to learn of it. With one sentinel configured, that sentinel is trusted.
///
/// The master in use and how often it changed are kept for the metrics, and a generation number
/// counts the moves, so that the writer and the subscription both leave a demoted master at once.
///
/// Thread-safety: all members may be called from any thread (the state behind one lock, never
/// held while connecting).
final class RedisSentinelDirectory: Sendable {
    /// The sentinels of the URL.
    let sentinel: RedisEndpoint.Sentinel
    /// How long the sentinels have to agree: 500 ms.
    static let decisionSeconds = 0.5

    private struct State {
        /// The master in use (last connected to).
        var master: RedisEndpoint.Host?
        /// Times the master in use changed.
        var changes: UInt64 = 0
        /// Increases with every move to a new master.
        var generation: UInt64 = 0
        /// Where to connect next without asking the sentinels: the address a majority named, or
        /// a replica they listed that a `+switch-master` promoted; `nil` to ask them.
        var vouched: RedisEndpoint.Host?
        /// The master's replicas as a majority of the sentinels listed them.
        var replicas: Set<RedisEndpoint.Host> = []
    }

    private let state = Locked(State())

    /// A directory of `sentinel`'s sentinels.
    init(_ sentinel: RedisEndpoint.Sentinel) {
        self.sentinel = sentinel
    }

    /// The sentinels, in the URL's order.
    var sentinels: [RedisEndpoint.Host] { sentinel.hosts }

    /// The endpoint of one sentinel: its password, TLS as the URL says, no database.
    func endpoint(of host: RedisEndpoint.Host, like endpoint: RedisEndpoint) -> RedisEndpoint {
        var sentinelEndpoint = RedisEndpoint(
            address: .tcp(host: host.host, port: host.port), password: sentinel.password, tls: endpoint.tls)
        sentinelEndpoint.sentinel = nil
        return sentinelEndpoint
    }

    /// Where the master is: the vouched address when there is one, else what a majority of the
    /// sentinels says (`vouch`), which is then remembered.
    /// - Throws: as `vouch`.
    func findMaster(like endpoint: RedisEndpoint, credentials: TLSClientCredentials?)
        throws(RedisConnectionError) -> RedisEndpoint.Host
    {
        if let vouched = state.withLock({ $0.vouched }) { return vouched }
        let agreed = try vouch(like: endpoint, credentials: credentials)
        state.withLock { state in
            state.vouched = agreed.master
            state.replicas = agreed.replicas
        }
        return agreed.master
    }

    /// The connection to `master` failed, or it is not a master: the next connect asks the
    /// sentinels again.
    func forget(_ master: RedisEndpoint.Host) {
        state.withLock { state in
            if state.vouched == master { state.vouched = nil }
        }
    }

    /// What a majority of the sentinels agreed on.
    struct Agreement: Sendable, Equatable {
        /// The master they name.
        var master: RedisEndpoint.Host
        /// The master's replicas that a majority lists.
        var replicas: Set<RedisEndpoint.Host>
    }

    /// One sentinel's answer.
    struct Answer: Sendable, Equatable {
        /// The master it names, `nil` when it knows no master of that name.
        var master: RedisEndpoint.Host?
        /// The replicas it lists.
        var replicas: [RedisEndpoint.Host]
    }

    /// What the answers so far decide.
    enum Decision: Sendable, Equatable {
        /// More than half of the configured sentinels name one master.
        case agreed(Agreement)
        /// No majority yet, and one is still possible.
        case waiting
        /// No majority is possible (or the time is up): the error says why.
        case failed(RedisConnectionError)
    }

    /// Decides from `answers` (one per sentinel that answered or failed) whether more than half
    /// of the `configured` sentinels name one master; `complete` when no other answer will be
    /// waited for (all arrived, or the 500 ms are up).
    static func decide(
        _ answers: [(host: RedisEndpoint.Host, result: Result<Answer, RedisConnectionError>)], configured: Int,
        complete: Bool, masterName: String = "the master"
    ) -> Decision {
        let majority = configured / 2 + 1
        var named: [RedisEndpoint.Host: Int] = [:]
        var listed: [RedisEndpoint.Host: Int] = [:]
        for case .success(let answer) in answers.map(\.result) {
            if let master = answer.master { named[master, default: 0] += 1 }
            for replica in Set(answer.replicas) { listed[replica, default: 0] += 1 }
        }
        if let (master, _) = named.first(where: { $0.value >= majority }) {
            let replicas = Set(listed.filter { $0.value >= majority && $0.key != master }.keys)
            return .agreed(Agreement(master: master, replicas: replicas))
        }
        let outstanding = complete ? 0 : configured - answers.count
        if (named.values.max() ?? 0) + outstanding >= majority { return .waiting }
        // No majority: say why, sentinel by sentinel (never a password).
        var reasons: [String] = []
        var answered = false
        var refusal: RedisConnectionError?
        for (host, result) in answers {
            switch result {
            case .success(let answer):
                answered = true
                reasons.append(
                    answer.master.map { "\(host) names \($0)" }
                        ?? "sentinel \(host) knows no master named \(masterName)")
            case .failure(let error):
                switch error {
                case .authFailed(let why):
                    refusal = .authFailed("sentinel \(host) refused the sentinel password: \(why)")
                case .tlsFailed: refusal = refusal ?? error
                default: break
                }
                reasons.append("\(host): \(error)")
            }
        }
        if answers.count < configured { reasons.append("\(configured - answers.count) gave no answer in time") }
        let why = reasons.joined(separator: "; ")
        if answered {
            return .failed(.noMaster("no majority of the \(configured) sentinels names one master (\(why))"))
        }
        if let refusal { return .failed(refusal) }
        return .failed(.sentinelsUnreachable(why))
    }

    /// Asks every sentinel at once and returns what more than half of the configured sentinels
    /// agree on, as soon as they do, waiting at most 500 ms.
    /// - Throws: `.noMaster` when sentinels answered but no majority names one master,
    ///   `.authFailed` or `.tlsFailed` when no sentinel answered and one refused for that reason,
    ///   else `.sentinelsUnreachable` with each sentinel's reason.
    func vouch(like endpoint: RedisEndpoint, credentials: TLSClientCredentials?) throws(RedisConnectionError)
        -> Agreement
    {
        let hosts = sentinels
        let answers = Locked<[(host: RedisEndpoint.Host, result: Result<Answer, RedisConnectionError>)]>([])
        let arrived = DispatchSemaphore(value: 0)
        let masterName = sentinel.masterName
        for host in hosts {
            let sentinelEndpoint = self.endpoint(of: host, like: endpoint)
            // Short work items: each is bounded by the 500 ms timeout of its connection and reads.
            DispatchQueue.global().async {
                let result = Self.ask(sentinelEndpoint, masterName: masterName, credentials: credentials)
                answers.withLock { $0.append((host, result)) }
                arrived.signal()
            }
        }
        let deadline = DispatchTime.now() + .milliseconds(Int(Self.decisionSeconds * 1000))
        while true {
            let timedOut = arrived.wait(timeout: deadline) == .timedOut
            let sofar = answers.withLock { $0 }
            let complete = timedOut || sofar.count == hosts.count
            switch Self.decide(sofar, configured: hosts.count, complete: complete, masterName: masterName) {
            case .agreed(let agreement): return agreement
            case .failed(let error): throw error
            case .waiting: continue
            }
        }
    }

    /// One sentinel's answer: the master it names and the replicas it lists.
    private static func ask(_ endpoint: RedisEndpoint, masterName: String, credentials: TLSClientCredentials?)
        -> Result<Answer, RedisConnectionError>
    {
        do throws(RedisConnectionError) {
            let connection = try RedisConnection(
                endpoint: endpoint, timeout: decisionSeconds, credentials: credentials, select: false)
            connection.append(["SENTINEL", "get-master-addr-by-name", masterName])
            connection.append(["SENTINEL", "replicas", masterName])
            try connection.flush()
            let deadline = monotonicSeconds() + decisionSeconds
            let masterReply = try connection.readReply(deadline: deadline)
            let replicasReply = try connection.readReply(deadline: deadline)
            var answer = Answer(master: nil, replicas: [])
            switch masterReply {
            case .array(let items) where items.count == 2:
                guard let master = host(items[0].text, items[1].text) else {
                    throw .noMaster("an address that is not HOST PORT")
                }
                answer.master = master
            case .error(let message):
                if let error = RedisConnectionError.classify(errorReply: message), case .authFailed = error {
                    throw error
                }
                throw .noMaster(String(message.prefix(120)))
            default:
                break
            }
            if case .array(let entries) = replicasReply {
                for case .array(let fields) in entries {
                    var ip: String?
                    var port: String?
                    var index = 0
                    while index + 1 < fields.count {
                        switch fields[index].text {
                        case "ip": ip = fields[index + 1].text
                        case "port": port = fields[index + 1].text
                        default: break
                        }
                        index += 2
                    }
                    if let replica = host(ip, port) { answer.replicas.append(replica) }
                }
            }
            return .success(answer)
        } catch {
            return .failure(error)
        }
    }

    /// A host and port as a sentinel gives them, or `nil` when they are not an address: 1 to 255
    /// of `A-Z a-z 0-9 . : - _`, and a port from 1 to 65535.
    static func host(_ address: String?, _ portText: String?) -> RedisEndpoint.Host? {
        guard let address, !address.isEmpty, address.utf8.count <= 255,
            address.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || ".:-_".contains($0)) }),
            let portText, let port = Int(portText), (1...65535).contains(port)
        else { return nil }
        return RedisEndpoint.Host(host: address, port: port)
    }

    /// Checks with `ROLE` that `connection` (to `master`) is a master.
    /// - Throws: `.noMaster` when it is not, `.authFailed` for `NOPERM` (the user lacks `+role`).
    func checkRole(of connection: RedisConnection, at master: RedisEndpoint.Host, timeout: Double)
        throws(RedisConnectionError)
    {
        let reply = try connection.command(["ROLE"], timeout: timeout)
        switch reply {
        case .array(let items) where items.first?.text == "master":
            return
        case .array(let items):
            let role = items.first?.text ?? "unknown"
            throw .noMaster("the sentinels name \(master), which is a \(role.prefix(20)), not a master")
        case .error(let message):
            throw RedisConnectionError.classify(errorReply: message) ?? .noMaster("ROLE failed: \(message.prefix(120))")
        default:
            throw .noMaster("ROLE gave no role")
        }
    }

    /// A connection to `master` was made: remember it (a different one counts as a change).
    func using(_ master: RedisEndpoint.Host) {
        state.withLock { state in
            if let old = state.master, old != master { state.changes &+= 1 }
            state.master = master
        }
    }

    /// Whether a majority of the sentinels listed `host` as a replica of the master.
    func isKnownReplica(_ host: RedisEndpoint.Host) -> Bool {
        state.withLock { $0.replicas.contains(host) }
    }

    /// The sentinels' majority answered again (`agreement`): its replicas are remembered, and
    /// when it names another master than the one in use, the writer and the subscription move
    /// there. Returns whether they move.
    @discardableResult
    func refreshed(_ agreement: Agreement) -> Bool {
        state.withLock { state in
            state.replicas = agreement.replicas
            guard let inUse = state.master, inUse != agreement.master else { return false }
            state.vouched = agreement.master
            state.generation &+= 1
            return true
        }
    }

    /// A `+switch-master` named `master`, a replica a majority listed (`isKnownReplica`): the
    /// writer and the subscription leave the old master and connect there at once. Returns
    /// whether they move (not when they are already there, or on the way there).
    @discardableResult
    func switched(to master: RedisEndpoint.Host) -> Bool {
        state.withLock { state in
            // Already there, or already on the way there.
            if state.vouched == master || (state.vouched == nil && state.master == master) { return false }
            state.vouched = master
            state.generation &+= 1
            return true
        }
    }

    /// Increases with every move to a new master.
    var generation: UInt64 { state.withLock { $0.generation } }

    /// The master in use, and the number of times it changed.
    var master: (host: RedisEndpoint.Host?, changes: UInt64) {
        state.withLock { ($0.master, $0.changes) }
    }
}

/// The store's subscription to the sentinels' `+switch-master` channel: one thread with its own
/// connection to one sentinel (the first that accepts, in the directory's order); a message for
/// this master makes the writer and the subscription move at once (`RedisSentinelDirectory.switched`).
/// When the sentinel goes away it subscribes on the next one.
///
/// Thread-safety: `run()` is called once, on the watcher's own thread.
final class RedisSentinelWatcher: Sendable {
    private let link: RedisLink
    private let directory: RedisSentinelDirectory

    /// A watcher for `link`'s sentinels.
    init(link: RedisLink, directory: RedisSentinelDirectory) {
        self.link = link
        self.directory = directory
    }

    /// Subscribes and listens until the store stops.
    func run() {
        var backoff = ReconnectBackoff()
        while !link.isStopping {
            var subscribed: RedisConnection?
            for host in directory.sentinels where subscribed == nil {
                do throws(RedisConnectionError) {
                    let connection = try link.connector.connectSentinel(host)
                    connection.append(["SUBSCRIBE", "+switch-master"])
                    try connection.flush()
                    let reply = try connection.readReply(deadline: monotonicSeconds() + link.configuration.writeTimeout)
                    guard case .array(let items) = reply, items.first?.text == "subscribe" else { continue }
                    subscribed = connection
                } catch {
                    continue
                }
            }
            guard let connection = subscribed else {
                sleep(seconds: backoff.next())
                continue
            }
            backoff.reset()
            listen(on: connection)
        }
    }

    /// Seconds between two refreshes of the sentinels' majority answer (the replicas they list,
    /// and a master that moved while no `+switch-master` reached this watcher): 60.
    static let refreshSeconds = 60.0
    /// How long after a `+switch-master` naming an address no majority listed the majority is
    /// asked again, every `recheckSeconds`, for the move (the other sentinels learn of a failover
    /// from the leader's hello messages, every 2 s, later on a loaded machine: a window of 5 s was
    /// missed in a test run, leaving the replicas on the old master until the 60 s refresh): 30 s.
    static let recheckWindowSeconds = 30.0
    /// Between two of those questions: 250 ms.
    static let recheckSeconds = 0.25

    private func listen(on connection: RedisConnection) {
        var lastPing = monotonicSeconds()
        var pingSent: Double?
        var nextRefresh = monotonicSeconds() + Self.refreshSeconds
        // After an unvouched +switch-master: until when to ask the majority, and when next.
        var recheck: (until: Double, next: Double)?
        while !link.isStopping {
            let reply: RedisReply?
            do throws(RedisConnectionError) {
                reply = try connection.pollReply(milliseconds: 100)
            } catch {
                if case .replyTooLarge = error {
                    link.telemetry.ignored(.oversized, "a sentinel sent \(error); subscribing again")
                }
                return
            }
            switch reply {
            case .array(let items) where items.count == 3 && items[0].text == "message":
                if let announced = switchMaster(items[2].text), !directory.isKnownReplica(announced) {
                    let now = monotonicSeconds()
                    recheck = (now + Self.recheckWindowSeconds, recheck?.next ?? now)
                }
            case .array(let items) where items.first?.text?.lowercased() == "pong":
                pingSent = nil
            case .status(let text) where text == "PONG":
                pingSent = nil
            default:
                break
            }
            var now = monotonicSeconds()
            if let due = recheck, now >= due.next || now >= nextRefresh {
                let moved = askMajority()
                now = monotonicSeconds()
                nextRefresh = now + Self.refreshSeconds
                recheck = moved || now >= due.until ? nil : (due.until, now + Self.recheckSeconds)
            } else if now >= nextRefresh {
                askMajority()
                now = monotonicSeconds()
                nextRefresh = now + Self.refreshSeconds
            }
            if let sent = pingSent, now - sent > link.configuration.heartbeatTimeout { return }
            if pingSent == nil, now - lastPing >= link.configuration.heartbeatInterval {
                connection.append(["PING"])
                do throws(RedisConnectionError) { try connection.flush() } catch { return }
                lastPing = now
                pingSent = now
            }
        }
    }

    /// A `+switch-master` message ("NAME OLD-IP OLD-PORT NEW-IP NEW-PORT"): for this master,
    /// naming a replica a majority listed that answers `ROLE` as a master, the writer and the
    /// subscription move there at once;
    /// naming any other address, it is returned, for the majority to be asked
    /// (docs/replicas.md, "What a replica trusts"). One for another master, or not of that
    /// shape, is counted and ignored. Log lines are limited to one per 10 s per kind.
    private func switchMaster(_ text: String?) -> RedisEndpoint.Host? {
        let fields = text?.split(separator: " ", omittingEmptySubsequences: false) ?? []
        guard fields.count == 5, fields[0] == directory.sentinel.masterName,
            let announced = RedisSentinelDirectory.host(String(fields[3]), String(fields[4]))
        else {
            link.telemetry.ignored(
                .switchMaster, "ignored a +switch-master that is not for master \(directory.sentinel.masterName)")
            return nil
        }
        guard directory.isKnownReplica(announced) else {
            link.telemetry.ignored(
                .unvouched,
                "a sentinel announced \(announced) as master \(fields[0]), which no majority of the sentinels "
                    + "lists as its replica; asking the sentinels")
            return announced
        }
        // One sentinel said so: the move happens only once the announced replica answers ROLE
        // with master, so that a rogue sentinel naming a replica that was not promoted cannot
        // make the replica leave a working master (attack finding: writes refused while it
        // flapped between two replicas).
        guard link.connector.isMaster(announced) else {
            link.telemetry.ignored(
                .unvouched,
                "a sentinel announced \(announced) as master \(fields[0]), but it does not answer ROLE as a master; "
                    + "asking the sentinels")
            return announced
        }
        if directory.switched(to: announced) {
            link.telemetry.logLimited(
                "switch", .info,
                "a sentinel switched master \(fields[0]) from \(fields[1]):\(fields[2]) to \(announced), a replica the "
                    + "sentinels' majority lists, which answers ROLE as a master")
        }
        return nil
    }

    /// Asks the sentinels' majority (at most 500 ms); returns whether the writer and the
    /// subscription move to another master.
    @discardableResult
    private func askMajority() -> Bool {
        let agreement: RedisSentinelDirectory.Agreement
        do throws(RedisConnectionError) {
            agreement = try link.connector.vouch()
        } catch {
            return false
        }
        guard directory.refreshed(agreement) else { return false }
        link.telemetry.logLimited(
            "switch", .info,
            "the sentinels switched master \(directory.sentinel.masterName) to \(agreement.master) "
                + "(a majority of the sentinels names it)")
        return true
    }

    private func sleep(seconds: Double) {
        let end = monotonicSeconds() + seconds
        while !link.isStopping {
            let left = end - monotonicSeconds()
            if left <= 0 { return }
            usleep(useconds_t(min(left, 0.05) * 1_000_000))
        }
    }
}
