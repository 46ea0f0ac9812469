import ForgePushToken

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The store's subscription to `PREFIX:changes`: one thread with its own connection
/// (docs/replicas.md, "When something fails").
///
/// It subscribes, then tells the link (which asks the writer to read `PREFIX:state`, so that a
/// change made while it was away is never missed), and hands every change message another
/// replica's script published to `RedisLink.learned` (this store's own, named by its
/// `"writer"` field, reached the owner from the writer already). It wakes at least every 100 ms
/// to let the link's machine decide pings, periodic checks and reconnects, and reconnects with
/// `ReconnectBackoff`.
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
        while !link.isStopping {
            let connection: RedisConnection
            do throws(RedisConnectionError) {
                connection = try link.connect()
                connection.append(["SUBSCRIBE", channel])
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
                link.countError()
                let health = RedisLinkStateMachine.Health(error)
                link.handle { $0.subscriptionFailed(health, detail: error.description, at: monotonicSeconds()) }
                sleep(seconds: backoff.next())
                continue
            }
            backoff.reset()
            if !first { link.countReconnect() }
            first = false
            link.handle { $0.subscribed(at: monotonicSeconds()) }
            if let why = listen(on: connection, channel: channel) {
                link.countError()
                link.handle { $0.subscriptionFailed(.unreachable, detail: why, at: monotonicSeconds()) }
                sleep(seconds: backoff.next())
            } else {
                link.note { $0.unsubscribed() }
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

    /// Reads messages until the connection fails (returns why) or the store stops (nil).
    private func listen(on connection: RedisConnection, channel: String) -> String? {
        while !link.isStopping {
            let reply: RedisReply?
            do throws(RedisConnectionError) {
                reply = try connection.pollReply(milliseconds: 100)
            } catch {
                return error.description
            }
            if let reply {
                switch reply {
                case .array(let items) where items.count == 3 && items.first?.text == "message":
                    if case .bulk(let payload) = items[2] { received(payload, channel: channel) }
                case .array(let items) where items.first?.text?.lowercased() == "pong":
                    link.note { $0.pong() }
                case .status(let text) where text == "PONG":
                    link.note { $0.pong() }
                case .error(let message):
                    return "error on the subscription: \(message.prefix(120))"
                default:
                    break
                }
            }
            for action in link.handle({ $0.tick(at: monotonicSeconds()) }) {
                switch action {
                case .ping:
                    connection.append(["PING"])
                    do throws(RedisConnectionError) { try connection.flush() } catch { return error.description }
                case .reconnect(let reason):
                    return reason
                case .report, .log, .requestCheck:
                    break
                }
            }
        }
        return nil
    }

    private func received(_ payload: [UInt8], channel: String) {
        do {
            let change = try RedisCodec.change(message: payload)
            // This store's own write reached the owner from the writer (its commit's completion,
            // or its check's report): not a second time.
            if change.writer != link.writerID { link.learned(change.state) }
        } catch {
            link.countError()
            link.log(.warning, "ignored a message on \(channel) that this service did not write: \(error)")
            link.handle { $0.messageInvalid() }
        }
    }
}
