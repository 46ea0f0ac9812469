import ForgePushToken
import GnuTLSClient

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Finding the master through Redis Sentinel, as the Sentinel documentation's client guidelines
/// describe it (docs/replicas.md, "Redis Sentinel"): ask the sentinels in turn
/// `SENTINEL get-master-addr-by-name MASTER_NAME`, connect to the first answer, check that `ROLE`
/// says `master` (a sentinel that has not seen a failover yet may name the old master), and move
/// the sentinel that answered to the front of the list. The master in use and how often it
/// changed are kept for the metrics, and a generation number counts the moves announced by
/// `+switch-master` (`RedisSentinelWatcher`), so that the writer and the subscription both leave
/// a demoted master at once.
///
/// Thread-safety: all members may be called from any thread (each state behind its own lock,
/// none held while connecting).
final class RedisSentinelDirectory: Sendable {
    /// The sentinels of the URL.
    let sentinel: RedisEndpoint.Sentinel
    private let order: Locked<[RedisEndpoint.Host]>
    /// The master in use (last found), the number of changes of it, and the generation.
    private let state = Locked<(master: RedisEndpoint.Host?, changes: UInt64, generation: UInt64)>((nil, 0, 0))

    /// A directory of `sentinel`'s sentinels.
    init(_ sentinel: RedisEndpoint.Sentinel) {
        self.sentinel = sentinel
        self.order = Locked(sentinel.hosts)
    }

    /// The sentinels, the one that answered last first.
    var sentinels: [RedisEndpoint.Host] { order.withLock { $0 } }

    /// The endpoint of one sentinel: its password, TLS as the URL says, no database.
    func endpoint(of host: RedisEndpoint.Host, like endpoint: RedisEndpoint) -> RedisEndpoint {
        var sentinelEndpoint = RedisEndpoint(
            address: .tcp(host: host.host, port: host.port), password: sentinel.password, tls: endpoint.tls)
        sentinelEndpoint.sentinel = nil
        return sentinelEndpoint
    }

    /// Asks the sentinels in turn for the master's address.
    /// - Throws: `.noMaster` when a sentinel answered but knows no such master, `.authFailed` or
    ///   `.tlsFailed` when every sentinel refused the connection for that reason, else
    ///   `.sentinelsUnreachable` with each sentinel's reason.
    func findMaster(like endpoint: RedisEndpoint, timeout: Double, credentials: TLSClientCredentials?)
        throws(RedisConnectionError) -> RedisEndpoint.Host
    {
        var reasons: [String] = []
        var knowsNone: String?
        var refusal: RedisConnectionError?
        for host in sentinels {
            do throws(RedisConnectionError) {
                let connection = try RedisConnection(
                    endpoint: self.endpoint(of: host, like: endpoint), timeout: timeout, credentials: credentials,
                    select: false)
                let reply = try connection.command(
                    ["SENTINEL", "get-master-addr-by-name", sentinel.masterName], timeout: timeout)
                switch reply {
                case .array(let items) where items.count == 2:
                    guard let address = items[0].text, !address.isEmpty, address.utf8.count <= 255,
                        address.allSatisfy({
                            $0.isASCII && ($0.isLetter || $0.isNumber || ".:-_".contains($0))
                        }),
                        let portText = items[1].text, let port = Int(portText), (1...65535).contains(port)
                    else {
                        reasons.append("\(host): an address that is not HOST PORT")
                        continue
                    }
                    moveToFront(host)
                    return RedisEndpoint.Host(host: address, port: port)
                case .error(let message):
                    if let error = RedisConnectionError.classify(errorReply: message), case .authFailed = error {
                        throw error
                    }
                    reasons.append("\(host): \(message.prefix(120))")
                default:
                    knowsNone = "sentinel \(host) knows no master named \(sentinel.masterName)"
                }
            } catch {
                switch error {
                case .authFailed(let why):
                    refusal = .authFailed("sentinel \(host) refused the sentinel password: \(why)")
                case .tlsFailed:
                    refusal = refusal ?? error
                default:
                    break
                }
                reasons.append("\(host): \(error)")
            }
        }
        if let knowsNone { throw .noMaster(knowsNone) }
        if let refusal { throw refusal }
        throw .sentinelsUnreachable(reasons.joined(separator: "; "))
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

    /// The sentinels announced a new master (`+switch-master`): the writer and the subscription
    /// leave the old one.
    func switched() {
        state.withLock { $0.generation &+= 1 }
    }

    /// Increases with every `+switch-master` for this master.
    var generation: UInt64 { state.withLock { $0.generation } }

    /// The master in use, and the number of times it changed.
    var master: (host: RedisEndpoint.Host?, changes: UInt64) {
        state.withLock { ($0.master, $0.changes) }
    }

    private func moveToFront(_ host: RedisEndpoint.Host) {
        order.withLock { hosts in
            guard let index = hosts.firstIndex(of: host), index > 0 else { return }
            hosts.remove(at: index)
            hosts.insert(host, at: 0)
        }
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
                    let connection = try link.connectSentinel(host)
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

    private func listen(on connection: RedisConnection) {
        var lastPing = monotonicSeconds()
        var pingSent: Double?
        while !link.isStopping {
            let reply: RedisReply?
            do throws(RedisConnectionError) {
                reply = try connection.pollReply(milliseconds: 100)
            } catch {
                return
            }
            switch reply {
            case .array(let items) where items.count == 3 && items[0].text == "message":
                // "+switch-master NAME OLD-IP OLD-PORT NEW-IP NEW-PORT"
                let fields = items[2].text?.split(separator: " ") ?? []
                if fields.count == 5, fields[0] == directory.sentinel.masterName {
                    link.log(
                        .info,
                        "the sentinels switched master \(fields[0]) from \(fields[1]):\(fields[2]) to "
                            + "\(fields[3]):\(fields[4])")
                    directory.switched()
                }
            case .array(let items) where items.first?.text?.lowercased() == "pong":
                pingSent = nil
            case .status(let text) where text == "PONG":
                pingSent = nil
            default:
                break
            }
            let now = monotonicSeconds()
            if let sent = pingSent, now - sent > link.configuration.heartbeatTimeout { return }
            if pingSent == nil, now - lastPing >= link.configuration.heartbeatInterval {
                connection.append(["PING"])
                do throws(RedisConnectionError) { try connection.flush() } catch { return }
                lastPing = now
                pingSent = now
            }
        }
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
