import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// The service's metrics, rendered for `GET /metrics` in the Prometheus text exposition format,
/// version 0.0.4 (Prometheus documentation, "Exposition formats").
///
/// Names follow Prometheus conventions: the `forge_push_token_` prefix, `_total` on counters,
/// base units (seconds). Label values come from fixed sets (routes, methods), so the number of
/// series is bounded whatever clients send.
///
/// Thread-safety: all members may be called from any thread. The counters are kept per thread
/// (`PerThreadLocked`: each thread counts in its own shard, under a lock no other counting thread
/// takes), so that requests on different threads never wait for one another here; `render` adds
/// the shards up.
public final class ServiceMetrics: Sendable {
    /// A plain counter of the service.
    public enum Counter: Int, Sendable, CaseIterable {
        /// Changes of the token (each bumps the version).
        case tokenChanges
        /// `POST /register` requests whose token was accepted (changed or not).
        case registrationsAccepted
        /// `POST /register` requests rejected with 400 (a 413 is refused before the responder).
        case registrationsRejected
        /// `POST /fail` requests accepted (a registration failure reported: logged, and the token
        /// cleared).
        case failuresReported
        /// Requests refused with 401 for a missing or wrong bearer token.
        case unauthorizedRequests
        /// Writes refused with 403 `insufficient_scope`: sent with a read token.
        case forbiddenRequests
        /// Reloads of the token files that put new sets in force (docs/operations.md, "Rotating
        /// tokens").
        case credentialReloadsOK
        /// Reloads of the token files that failed; the sets in force stayed.
        case credentialReloadsFailed
        /// Connections closed at once because the service had `--max-connections` open.
        case connectionsRefusedTotalLimit
        /// Connections closed at once because their client address had `--max-connections-per-ip`.
        case connectionsRefusedPerAddressLimit
        /// Requests whose head was not complete within `--header-timeout`.
        case requestTimeoutsHead
        /// Requests whose body was not complete within `--header-timeout` of their head.
        case requestTimeoutsBody

        var name: String {
            switch self {
            case .tokenChanges: "forge_push_token_token_changes_total"
            case .registrationsAccepted: "forge_push_token_registrations_accepted_total"
            case .registrationsRejected: "forge_push_token_registrations_rejected_total"
            case .failuresReported: "forge_push_token_failures_reported_total"
            case .unauthorizedRequests: "forge_push_token_unauthorized_requests_total"
            case .forbiddenRequests: "forge_push_token_forbidden_requests_total"
            case .credentialReloadsOK: "forge_push_token_credentials_reloads_total{result=\"ok\"}"
            case .credentialReloadsFailed: "forge_push_token_credentials_reloads_total{result=\"failed\"}"
            case .connectionsRefusedTotalLimit: "forge_push_token_connections_refused_total{limit=\"total\"}"
            case .connectionsRefusedPerAddressLimit: "forge_push_token_connections_refused_total{limit=\"per_ip\"}"
            case .requestTimeoutsHead: "forge_push_token_request_timeouts_total{phase=\"head\"}"
            case .requestTimeoutsBody: "forge_push_token_request_timeouts_total{phase=\"body\"}"
            }
        }

        var help: String {
            switch self {
            case .tokenChanges: "Changes of the device token; each bumps the version."
            case .registrationsAccepted: "POST /register requests whose device token was accepted."
            case .registrationsRejected: "POST /register requests rejected with 400 (an invalid device token)."
            case .failuresReported: "POST /fail requests accepted: registration failures reported."
            case .unauthorizedRequests: "Requests refused with 401: missing or wrong bearer token."
            case .forbiddenRequests: "Writes refused with 403 insufficient_scope: sent with a read token."
            case .credentialReloadsOK, .credentialReloadsFailed:
                "Reloads of the token files (SIGHUP or a changed file) by result; a failed one keeps the tokens in force."
            case .connectionsRefusedTotalLimit, .connectionsRefusedPerAddressLimit:
                "Connections closed on accept because a connection limit was reached."
            case .requestTimeoutsHead, .requestTimeoutsBody:
                "Requests whose head or body took longer than --header-timeout: answered 408 where possible, closed."
            }
        }
    }

    /// Upper bounds of the request-duration histogram's buckets, in seconds.
    public static let durationBuckets: [Double] = [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
    ]

    /// The methods counted by name; any other is `other`.
    static let methodNames = ["GET", "HEAD", "POST", "OPTIONS", "other"]
    /// The routes by code: `Route.allCases` in order, then `other` (a path that is none of them).
    static let routeNames = Route.allCases.map(\.rawValue) + ["other"]

    /// A request's series: small codes, so that counting one hashes three integers, not two
    /// strings (`routeNames`, `methodNames`).
    struct RequestKey: Hashable, Sendable {
        let route: UInt8
        let method: UInt8
        let status: Int

        /// One word hashed, not three values: once per request, and the synthesized hashing fed
        /// the hasher three times (statuses fit in 48 bits many times over; equality still
        /// compares every field).
        func hash(into hasher: inout Hasher) {
            hasher.combine(UInt64(route) | UInt64(method) << 8 | UInt64(truncatingIfNeeded: status) << 16)
        }
    }

    struct State: Sendable {
        var counters = [UInt64](repeating: 0, count: Counter.allCases.count)
        var requests: [RequestKey: UInt64] = [:]
        /// By route code (`routeNames`); `nil` until a request of that route is timed.
        var durations = [Histogram?](repeating: nil, count: ServiceMetrics.routeNames.count)
        /// Event streams ended, by `StreamEndReason` in `allCases` order.
        var streamsEnded = [UInt64](repeating: 0, count: StreamEndReason.allCases.count)

        /// Adds `other`'s counts to these.
        mutating func add(_ other: State) {
            for index in counters.indices { counters[index] &+= other.counters[index] }
            for (key, count) in other.requests { requests[key, default: 0] &+= count }
            for (route, histogram) in other.durations.enumerated() {
                guard let histogram else { continue }
                if durations[route] == nil { durations[route] = Histogram(bounds: histogram.bounds) }
                durations[route]?.add(histogram)
            }
            for index in streamsEnded.indices { streamsEnded[index] &+= other.streamsEnded[index] }
        }
    }

    /// The counts, one shard per thread that counts.
    private let shards = PerThreadLocked { State() }
    private let buildVersion = Locked<String?>(nil)
    /// When the service started, in seconds since the Unix epoch (`process_start_time_seconds`
    /// where `/proc` cannot be read).
    public let startTime: Double

    /// Creates metrics, all zero, with the start time now.
    public init() {
        startTime = Date.now.timeIntervalSince1970
    }

    /// Sets the version that `forge_push_token_build_info{version="…"} 1` reports (not exported
    /// until set).
    public func setBuildVersion(_ version: String) {
        buildVersion.withLock { $0 = version }
    }

    /// Adds one to `counter`.
    public func increment(_ counter: Counter) {
        shards.withThreadLock { $0.counters[counter.rawValue] &+= 1 }
    }

    /// Records one completed HTTP request.
    /// - Parameters:
    ///   - route: the request's route (matched once, by `Responder.admit`), or `nil` for a path that
    ///     is none of the API's, counted as `route="other"`.
    ///   - method: the method; other than GET, HEAD, POST, OPTIONS it is counted as `other`.
    ///   - status: the status code sent.
    ///   - seconds: from the request's arrival to its completion, or `nil` when not timed (event
    ///     streams, whose duration is the connection's lifetime, and requests the engine answered
    ///     on a fast path without a start time).
    public func recordRequest(route: Route?, method: String, status: Int, seconds: Double?) {
        // Once per request: no array literal, the bucket found outside the lock, the histogram
        // updated in place (copying it out of the dictionary and back copied its buckets).
        let routeCode = route.flatMap { Route.allCases.firstIndex(of: $0) } ?? Route.allCases.count
        let methodCode: UInt8 =
            switch method {
            case "GET": 0
            case "HEAD": 1
            case "POST": 2
            case "OPTIONS": 3
            default: 4
            }
        let key = RequestKey(route: UInt8(routeCode), method: methodCode, status: status)
        let bucket = seconds.flatMap { Histogram.bucket(of: $0, in: Self.durationBuckets) }
        shards.withThreadLock { state in
            state.requests[key, default: 0] &+= 1
            guard let seconds else { return }
            if state.durations[routeCode] == nil {
                state.durations[routeCode] = Histogram(bounds: Self.durationBuckets)
            }
            state.durations[routeCode]?.record(seconds, bucket: bucket)
        }
    }

    /// Counts one event stream that ended, under `reason`
    /// (`forge_push_token_streams_ended_total{reason}`).
    public func recordStreamEnded(_ reason: StreamEndReason) {
        let index = StreamEndReason.allCases.firstIndex(of: reason) ?? 0
        shards.withThreadLock { $0.streamsEnded[index] &+= 1 }
    }

    /// The exposition text (`Content-Type: text/plain; version=0.0.4; charset=utf-8`).
    /// - Parameters:
    ///   - subscribers: event-stream subscribers connected now.
    ///   - events: events sent to subscribers and skipped by conflation, since start.
    ///   - maxSubscribers: the configured subscriber limit (`--max-subscribers`), exported as
    ///     `forge_push_token_subscribers_limit`; `nil` leaves the series out.
    ///   - stateSaved: whether every change is in the state file (`forge_push_token_state_saved`
    ///     1, or 0 after a failed write); `nil` (no `--state-file`) leaves the series out.
    ///   - draining: whether the service is draining (`forge_push_token_draining` 1, else 0).
    ///   - tokens: the tokens in force per role, exported as
    ///     `forge_push_token_credentials_tokens{role}` (0 and 0 for a service without tokens).
    ///
    /// The process metrics (`process_*`) and the build information follow the service's own.
    public func render(
        subscribers: Int, events: DeliveryCounts, maxSubscribers: Int? = nil,
        stateSaved: Bool? = nil, draining: Bool = false, tokens: (read: Int, write: Int) = (0, 0)
    ) -> String {
        var state = State()
        shards.forEachShard { state.add($0) }
        var out = PrometheusText()
        out.single("forge_push_token_subscribers", .gauge, help: "Event-stream subscribers connected now.", subscribers)
        Self.renderCounters(state.counters, to: &out)
        out.family(
            "forge_push_token_credentials_tokens", .gauge,
            help: "Bearer tokens in force by role (--read-token-file, --write-token-file, or the one --auth-token).")
        out.sample("forge_push_token_credentials_tokens", labels: #"role="read""#, tokens.read)
        out.sample("forge_push_token_credentials_tokens", labels: #"role="write""#, tokens.write)
        out.single(
            "forge_push_token_events_sent_total", .counter, help: "Token events written to subscribers.", events.sent)
        out.single(
            "forge_push_token_events_skipped_total", .counter,
            help: "Token events a slow subscriber skipped because a newer one replaced them (conflation).",
            events.skipped)
        out.family(
            "forge_push_token_streams_ended_total", .counter,
            help:
                "Event streams ended, by reason: client (went away), drain, age (--max-stream-age), shutdown, revoked.")
        for (reason, count) in zip(StreamEndReason.allCases, state.streamsEnded) {
            out.sample("forge_push_token_streams_ended_total", labels: "reason=\"\(reason.rawValue)\"", count)
        }
        out.single(
            "forge_push_token_draining", .gauge,
            help: "1 from a stopping replica's first signal to its exit while it drains (--drain-seconds), else 0.",
            draining ? 1 : 0)
        out.family(
            "forge_push_token_http_requests_total", .counter, help: "HTTP requests by route, method and status.")
        let requests = state.requests.map { key, count in
            (route: Self.routeNames[Int(key.route)], method: Self.methodNames[Int(key.method)], key.status, count)
        }
        for (route, method, status, count) in requests.sorted(by: { ($0.0, $0.1, $0.2) < ($1.0, $1.1, $1.2) }) {
            out.sample(
                "forge_push_token_http_requests_total",
                labels: "route=\"\(route)\",method=\"\(method)\",status=\"\(status)\"", count)
        }
        let name = "forge_push_token_http_request_duration_seconds"
        out.family(
            name, .histogram,
            help:
                "Time from a request's arrival to its completion, by route; not timed: event streams, and GET /token while the access log is off (an allocation-free path)."
        )
        let durations = state.durations.enumerated().compactMap { code, histogram in
            histogram.map { (route: Self.routeNames[code], histogram: $0) }
        }
        for (route, histogram) in durations.sorted(by: { $0.route < $1.route }) {
            out.histogram(name, labels: "route=\"\(route)\"", histogram)
        }
        operatorSeries(maxSubscribers: maxSubscribers, stateSaved: stateSaved, to: &out)
        return out.text
    }

    /// The plain counters' values now, by `Counter.rawValue`: the values `render` writes for them
    /// (through `renderCounters(_:to:)`). The request fuzzer reads them after every input
    /// (fuzz/README.md, "Speed").
    package func counterValues() -> [UInt64] {
        var counters = [UInt64](repeating: 0, count: Counter.allCases.count)
        shards.forEachShard { shard in
            for index in counters.indices { counters[index] &+= shard.counters[index] }
        }
        return counters
    }

    /// Appends `counters` (by `Counter.rawValue`, as `counterValues()` gives them) with their HELP
    /// and TYPE lines, in `allCases` order: the counters' lines of `render`'s text, which `render`
    /// writes with this function. A function of `counters` alone.
    package static func renderCounters(_ counters: [UInt64], to out: inout PrometheusText) {
        var previousFamily = ""
        for counter in Counter.allCases {
            // A labelled series shares its family's HELP and TYPE with the series before it.
            let familyName = String(counter.name.prefix { $0 != "{" })
            if familyName != previousFamily { out.family(familyName, .counter, help: counter.help) }
            previousFamily = familyName
            let labels = counter.name.dropFirst(familyName.count).dropFirst().dropLast()
            out.sample(familyName, labels: String(labels), counters[counter.rawValue])
        }
    }

    /// The series operators' alerts read (docker/prometheus/rules.yml): the subscriber limit, the
    /// state file's health, the build, and the standard process metrics.
    private func operatorSeries(maxSubscribers: Int?, stateSaved: Bool?, to out: inout PrometheusText) {
        if let maxSubscribers {
            out.single(
                "forge_push_token_subscribers_limit", .gauge,
                help: "Most event-stream subscribers admitted at once (--max-subscribers).", maxSubscribers)
        }
        if let stateSaved {
            out.single(
                "forge_push_token_state_saved", .gauge,
                help:
                    "1 when every token change is saved in the state file, 0 after a write failed (until one succeeds).",
                stateSaved ? 1 : 0)
        }
        if let version = buildVersion.withLock({ $0 }) {
            let name = "forge_push_token_build_info"
            out.family(name, .gauge, help: "Always 1; the version label names the running build.")
            out.sample(name, labels: "version=\"\(PrometheusText.escapeLabel(version))\"", 1)
        }
        if let process = ProcessMetrics.read() {
            process.render(to: &out)
        } else {
            out.single(
                "process_start_time_seconds", .gauge, help: "Start time of the process since unix epoch in seconds.",
                startTime)
        }
    }

    /// The `Content-Type` of `render`'s text.
    public static let contentType = PrometheusText.contentType
}
