import ForgePushToken

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The store's subscription to `PREFIX:changes` and `PREFIX:probe`: one thread with its own
/// connection (docs/replicas.md, "When something fails").
///
/// It subscribes, then tells the link (which asks the writer to read `PREFIX:state`, so that a
/// change made while it was away is never missed), and hands every change message another
/// replica's script published to `RedisLink.announced` (this store's own, named by its
/// `"writer"` field, reached the owner from the writer already), and this replica's own delivery
/// probes to `RedisLink.probeHeard`. It wakes at least every 100 ms to let the link's machine
/// decide pings, probes, periodic checks and reconnects, and reconnects with `ReconnectBackoff`.
///
/// Thread-safety: `run()` is called once, on the subscription's own thread.
final class RedisSubscription: Sendable {
    private let link: RedisLink

    /// A subscription for `link`.
    init(link: RedisLink) {
        self.link = link
    }

    /// Subscribes and listens until the store stops, reconnecting as needed.
    func run() {
        var backoff = ReconnectBackoff()
        var first = true
        let channel = link.configuration.prefix.changesChannel
        let probeChannel = link.configuration.prefix.probeChannel
        while !link.isStopping {
            let connection: RedisConnection
            do throws(RedisConnectionError) {
                connection = try link.connector.connect()
                connection.append(["SUBSCRIBE", channel, probeChannel])
                try connection.flush()
                let reply = try connection.readReply(deadline: monotonicSeconds() + link.configuration.writeTimeout)
                guard case .array(let items) = reply, items.first?.text == "subscribe" else {
                    if case .error(let message) = reply {
                        throw RedisConnectionError.classify(errorReply: message)
                            ?? .refused(String(message.prefix(120)))
                    }
                    throw .unreachable("unexpected SUBSCRIBE reply")
                }
            } catch {
                link.telemetry.countError()
                let health = RedisLinkStateMachine.Health(error)
                link.handle { $0.subscriptionFailed(health, detail: error.description, at: link.now()) }
                sleep(seconds: backoff.next())
                continue
            }
            backoff.reset()
            if !first { link.telemetry.countReconnect() }
            first = false
            link.handle { $0.subscribed(at: link.now()) }
            switch listen(on: connection, channel: channel, probeChannel: probeChannel) {
            case .failed(let why):
                link.telemetry.countError()
                link.handle { $0.subscriptionFailed(.unreachable, detail: why, at: link.now()) }
                sleep(seconds: backoff.next())
            case .resubscribe:
                // Heard nothing: subscribe again at once (the link says `not_delivering`).
                link.telemetry.countReconnect()
                link.note { $0.unsubscribed() }
            case .oversized(let why):
                // Possibly a third party's PUBLISH: counted, and subscribed again at once with
                // subscribe-then-read; the health does not change (docs/replicas.md, "What a
                // replica trusts").
                link.telemetry.ignored(.oversized, "Redis sent the subscription \(why); subscribing again")
                link.note { $0.unsubscribed() }
            case .moved:
                // Subscribe on the new master at once, then read the state there (a change
                // acknowledged but lost in the failover is written back by that check).
                link.note { $0.unsubscribed() }
            case .stopped:
                link.note { $0.unsubscribed() }
            }
        }
    }

    /// Waits `seconds` before connecting again, or less when the sentinels announce a new master
    /// meanwhile (then the new one is tried at once).
    private func sleep(seconds: Double) {
        let end = monotonicSeconds() + seconds
        let generation = link.connector.directory?.generation
        while !link.isStopping, link.connector.directory?.generation == generation {
            let left = end - monotonicSeconds()
            if left <= 0 { return }
            usleep(useconds_t(min(left, 0.05) * 1_000_000))
        }
    }

    /// How listening ended.
    private enum End {
        /// The connection failed, for this reason.
        case failed(String)
        /// The sentinels announced a new master.
        case moved
        /// The subscription did not hear this replica's probe.
        case resubscribe
        /// A message passed the bounds of `RedisReplyLimits` (the error's words).
        case oversized(String)
        /// The store is stopping.
        case stopped
    }

    /// Reads messages until the connection fails, the master moves or the store stops.
    private func listen(on connection: RedisConnection, channel: String, probeChannel: String) -> End {
        while !link.isStopping {
            if link.connector.hasMoved(connection) { return .moved }
            let reply: RedisReply?
            do throws(RedisConnectionError) {
                // At most 100 ms, and no later than the delivery probe's next deadline.
                reply = try connection.pollReply(milliseconds: Int32(link.pollMilliseconds(longest: 100)))
            } catch {
                if case .replyTooLarge = error { return .oversized(error.description) }
                return .failed(error.description)
            }
            if let reply {
                switch reply {
                case .array(let items) where items.count == 3 && items.first?.text == "message":
                    guard case .bulk(let payload) = items[2] else { break }
                    if items[1].text == probeChannel {
                        if let sequence = RedisCodec.probeSequence(payload, writer: link.writerID) {
                            link.probeHeard(sequence: sequence)
                        } else if !RedisCodec.isProbe(payload) {
                            link.telemetry.ignored(
                                .probe, "ignored a message on \(probeChannel) that is not a delivery probe")
                        }
                    } else {
                        received(payload, channel: channel)
                    }
                case .array(let items) where items.first?.text?.lowercased() == "pong":
                    link.note { $0.pong() }
                case .status(let text) where text == "PONG":
                    link.note { $0.pong() }
                case .error(let message):
                    return .failed("error on the subscription: \(message.prefix(120))")
                default:
                    break
                }
            }
            for action in link.handle({ $0.tick(at: link.now()) }) {
                switch action {
                case .ping:
                    connection.append(["PING"])
                    do throws(RedisConnectionError) { try connection.flush() } catch {
                        return .failed(error.description)
                    }
                case .reconnect(let reason):
                    return .failed(reason)
                case .resubscribe:
                    return .resubscribe
                case .report, .log, .requestCheck, .probe, .ignored:
                    break
                }
            }
        }
        return .stopped
    }

    /// A message on `PREFIX:changes`: a notification that makes the writer read `PREFIX:state`
    /// when it announces a version above the replica's (`RedisLink.announced`), never a state the
    /// replica applies. Anyone allowed to publish on the channel can send one.
    private func received(_ payload: [UInt8], channel: String) {
        let change: RedisCodec.Change
        do {
            change = try RedisCodec.change(message: payload)
        } catch {
            link.telemetry.ignored(
                .malformed, "ignored a message on \(channel) that this service did not write: \(error)")
            return
        }
        // This store's own write reached the owner from the writer (its commit's completion):
        // not a second time.
        if change.writer != link.writerID { link.announced(change.state) }
    }
}
