import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

/// The service put together, in one place: the one owner of the token over its store, and the
/// responder that answers every route from it (docs/architecture.md, "One composition root").
///
/// Everything that runs the service builds it here: the executable (with its store from the
/// command line, under libmicrohttpd), the live-server tests (under libmicrohttpd on a free port),
/// the HTTP tests (no engine) and the fuzz harness (no engine, no socket). So each of them runs
/// the same wiring, and a new part of it is added once. An engine serves `responder`;
/// `shutdown(engine:)` stops the service in the one order there is (below), `close()` last.
///
/// Thread-safety: `Sendable`; `shutdown(engine:)` once (later calls return at once), `hurry()`
/// from any thread at any time.
public final class Service: Sendable {
    /// What the responder needs beyond the store: who may call what, which pages may read, what
    /// is logged. Defaults: an open service, no CORS, no log, no access log.
    public struct Settings: Sendable {
        /// The bearer token and its scope (`--auth-token`), or `nil` for an open service.
        public var authentication: BearerAuthentication?
        /// The origins allowed to read responses from a browser (`--cors-origin`).
        public var crossOrigin: CrossOriginPolicy
        /// Whether every finished request is logged (`--access-log`).
        public var accessLog: Bool
        /// The most event-stream subscribers at once (`--max-subscribers`, ≥ 1).
        public var maxSubscribers: Int
        /// Seconds a stopping service spends ending its event streams (`--drain-seconds`, 0 to
        /// 600; 0 ends them at once).
        public var drainSeconds: Int
        /// Each stream's age limit A in seconds (`--max-stream-age`: 0 for none, or 60 to 86,400).
        public var maxStreamAge: Int
        /// The clock of the service's time decisions: the drain's pace, the streams' ages
        /// (`ServerClock`). Default `.monotonic`; tests give a manual one. The engine has its own
        /// setting (`ServerConfiguration.clock`), given the same clock by whoever wires the two.
        public var clock: ServerClock

        /// Settings with the given values; each has the default of its flag.
        public init(
            authentication: BearerAuthentication? = nil, crossOrigin: CrossOriginPolicy = CrossOriginPolicy(),
            accessLog: Bool = false, maxSubscribers: Int = 10_000, drainSeconds: Int = 0, maxStreamAge: Int = 0,
            clock: ServerClock = .monotonic
        ) {
            self.clock = clock
            self.authentication = authentication
            self.crossOrigin = crossOrigin
            self.accessLog = accessLog
            self.maxSubscribers = maxSubscribers
            self.drainSeconds = drainSeconds
            self.maxStreamAge = maxStreamAge
        }

        /// What `--drain-seconds` accepts.
        public static let drainSecondsRange = 0...600
    }

    /// The one owner of the token, started.
    public let owner: TokenOwner<TokenSnapshot>
    /// The responder an engine serves.
    public let responder: Responder
    /// The drain window, in seconds (`Settings.drainSeconds`).
    public let drainSeconds: Int
    /// The drain's clock (`Settings.clock`).
    private let clock: ServerClock
    private let log: ServerLog?
    /// Whether `shutdown(engine:)` has begun, and whether a second signal came (`hurry()`).
    private let phase = Locked(Phase())
    /// Signalled by `hurry()`: the drain stops waiting for its next moment.
    private let hurried = DispatchSemaphore(value: 0)

    private struct Phase: Sendable {
        var shuttingDown = false
        var hurried = false
        var closed = false
    }

    /// The service over `store`, starting from `initial` with `health`, its owner started.
    /// - Parameters:
    ///   - store: where the token is kept; a store shared by replicas (Redis) also turns on the
    ///     HTTP layer's replica mode (`ReplicaMode(store:)`).
    ///   - initial: the state read from the store before start (a state file's contents), or
    ///     `.initial`.
    ///   - health: the store's health at start (`.starting` for a store not read yet).
    ///   - settings: authentication, CORS, access log, subscriber limit.
    ///   - log: where failures and the access log go (default: nowhere).
    public init(
        store: any TokenStore, initial: TokenState = .initial, health: StoreHealth = .ok,
        settings: Settings = Settings(), log: ServerLog? = nil
    ) {
        owner = TokenOwner(store: store, initial: initial, health: health, maxSubscribers: settings.maxSubscribers)
        owner.start()
        responder = Responder(
            owner: owner, authentication: settings.authentication, crossOrigin: settings.crossOrigin, log: log,
            accessLog: settings.accessLog, replica: ReplicaMode(store: store), maxStreamAge: settings.maxStreamAge,
            clock: settings.clock)
        drainSeconds = settings.drainSeconds
        clock = settings.clock
        self.log = log
    }

    /// Stops the service in the one order there is (docs/operations.md, "Draining";
    /// http-api.md, graceful shutdown), and returns when everything has stopped:
    /// 1. readiness off (`StreamGate.beginDraining()`: `/healthz` and `/readyz` answer
    ///    `503 draining`), with `drainSeconds` above 0;
    /// 2. the drain, while the engine still accepts and serves reads and writes: the streams open
    ///    now end one by one on a `DrainSchedule` over `drainSeconds`, and the window lasts its
    ///    `drainSeconds` whatever the number of streams (none included), until a second signal
    ///    (`hurry()`);
    /// 3. the remaining streams end cleanly and writes are refused (`TokenOwner.stop()`);
    /// 4. the engine stops accepting (`ServiceEngine.quiesce()`);
    /// 5. requests in flight get the engine's grace period (3 s, less the second kept for the
    ///    steps below; `ServiceEngine.awaitIdle()`);
    /// 6. what is left is ended (`TokenOwner.abortAll()`), every write still waiting for its
    ///    store is answered `503 store_unavailable`, and the engine stops (`ServiceEngine.stop()`);
    /// 7. the store's background work ends (`close()`), waited for up to `storeCloseSeconds`.
    ///
    /// Blocks the calling thread for up to `drainSeconds` plus the grace period, whatever the
    /// store is doing (a hung Redis, a slow disk). A second call returns at once.
    public func shutdown(engine: some ServiceEngine) {
        guard
            phase.withLock({ phase in
                defer { phase.shuttingDown = true }
                return !phase.shuttingDown
            })
        else { return }
        if drainSeconds > 0 {
            responder.streams.beginDraining()
            drain()
        }
        owner.stop()
        engine.quiesce()
        engine.awaitIdle()
        owner.abortAll()
        engine.stop()
        close()
    }

    /// A second `SIGTERM` or `SIGINT`: a drain in progress ends every remaining stream at once and
    /// shutdown goes on (a drain not begun yet is skipped). Any thread, any time; idempotent.
    public func hurry() {
        let first = phase.withLock { phase in
            defer { phase.hurried = true }
            return !phase.hurried
        }
        if first { hurried.signal() }
    }

    /// Step 2 of `shutdown(engine:)`: runs the `DrainSchedule` over the streams open now.
    private func drain() {
        let streams = owner.subscriberIDs
        var generator = SystemRandomNumberGenerator()
        var schedule = DrainSchedule(streams: streams, seconds: Double(drainSeconds), using: &generator)
        log?.log(.info, "draining \(streams.count) event streams over \(drainSeconds) s")
        let start = clock.now
        var step = phase.withLock { $0.hurried } ? schedule.secondSignal() : schedule.advance(toSeconds: 0)
        while true {
            for id in step.end { owner.finish(id, reason: .drain) }
            guard case .wake(let seconds) = step.next else { break }
            let moment = start + .milliseconds(Int64((seconds * 1000).rounded(.up)))
            // Ends at the moment, at `hurry()`, or early (a manual clock moved): the flag decides.
            clock.wait(on: hurried, for: moment - clock.now)
            if phase.withLock({ $0.hurried }) {
                step = schedule.secondSignal()
                log?.log(.info, "second signal: ending the \(schedule.remaining.count) remaining event streams at once")
            } else {
                step = schedule.advance(toSeconds: (clock.now - start).inSeconds)
            }
        }
    }

    /// Shutdown's final step, after the engine has stopped: the store's background work ends
    /// (writes still in flight during graceful shutdown kept their store until now). Waits up to
    /// `storeCloseSeconds` for the store (`TokenOwner.close()`, on another thread), then returns
    /// whether or not it has finished, saying so in the log: a store that does not answer (a hung
    /// Redis, an `fsync` that takes seconds) does not hold the process. Nothing answered is lost
    /// then: every write was answered after its store confirmed it, or `503` (it may or may not
    /// be stored). Idempotent.
    public func close() {
        guard
            phase.withLock({ phase in
                defer { phase.closed = true }
                return !phase.closed
            })
        else { return }
        let closed = DispatchSemaphore(value: 0)
        let finished = Locked(false)
        DispatchQueue.global().async { [owner] in
            owner.close()
            finished.withLock { $0 = true }
            closed.signal()
        }
        // On the service's clock (a manual one's wait may end early: the flag and the time decide).
        let deadline = clock.now + .milliseconds(Int(Self.storeCloseSeconds * 1000))
        while !finished.withLock({ $0 }), deadline > clock.now {
            clock.wait(on: closed, for: deadline - clock.now)
        }
        if !finished.withLock({ $0 }) {
            log?.log(.warning, "the token's store did not stop within \(Self.storeCloseSeconds) s; stopping without it")
        }
    }

    /// The most seconds `close()` waits for the store to stop.
    public static let storeCloseSeconds = 0.5
}
