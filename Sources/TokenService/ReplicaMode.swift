import ForgePushTokenOwner
import HTTPServing
import ServerSupport

/// What the HTTP layer does differently when the service is one replica of several sharing the
/// token through a store such as Redis (docs/replicas.md):
/// - `GET`/`HEAD /token` answer `503 store_unavailable` (`Retry-After: 1`) until the state has
///   been read once, and carry `Token-Stale: true` while the store is degraded;
/// - `/healthz` adds the store's state under `name` (`"redis":"connected"`, or the reason);
/// - every event stream starts with `retry: R`, `R` random in `retryMilliseconds`, so that the
///   subscribers of a replica that stops do not all reconnect at once;
/// - a stream whose `Last-Event-ID` is above the replica's version asks the store to read the
///   state again (`refresh`) and is never sent an id below that `Last-Event-ID`;
/// - `/metrics` appends the store's own metrics (`metrics`).
///
/// Thread-safety: a `Sendable` value; its closures may be called from any thread.
public struct ReplicaMode: Sendable {
    /// The field of `/healthz` that carries the store's state (`redis`).
    public var name: String
    /// Asks the store to read the shared state again soon (without waiting for it).
    public var refresh: @Sendable () -> Void
    /// The store's metrics, in the Prometheus text format.
    public var metrics: @Sendable () -> String
    /// The range of the `retry:` field sent at the start of every stream, in milliseconds.
    public var retryMilliseconds: ClosedRange<Int> = ReplicaMode.defaultRetryMilliseconds

    /// The `retry:` range a replica sends, and a draining service alone: 1 to 5 seconds.
    public static let defaultRetryMilliseconds = 1000...5000

    /// The mode for `store` when it is shared by several replicas (its `StoreStatus.sharedName`
    /// is set): its name, refresh and metrics. `nil` for a store the process has alone.
    public init?(store: any TokenStore) {
        guard let name = store.status().sharedName else { return nil }
        self.init(name: name, refresh: { store.refresh() }, metrics: { store.status().metricsText })
    }

    /// Creates the mode.
    public init(name: String, refresh: @escaping @Sendable () -> Void, metrics: @escaping @Sendable () -> String) {
        self.name = name
        self.refresh = refresh
        self.metrics = metrics
    }

    /// The `/healthz` answer for `health` (`shutting_down` is decided before): `200
    /// {"status":"ok","<name>":"connected"}`, `200 {"status":"degraded","<name>":"<why>"}`, or
    /// `503 {"status":"starting","<name>":"<why>"}`.
    func healthResponse(_ health: StoreHealth) -> HTTPResponse {
        switch health {
        case .ok: return .json(200, encoding: ["status": "ok", name: "connected"])
        case .degraded(let reason): return .json(200, encoding: ["status": "degraded", name: reason.rawValue])
        case .starting(let reason): return .json(503, encoding: ["status": "starting", name: reason.rawValue])
        }
    }

    /// The `503 store_unavailable` of a read before the state is known.
    static let notReadYet = HTTPResponse.error(
        503,
        ServiceError(
            "store_unavailable",
            "the replica has not read the shared token yet; retry"),
        headers: ["Retry-After": "1"])

    /// The `GET /token` answer under `health`, from `response` (the answer the service gives
    /// alone): as is while healthy, with `Token-Stale: true` while degraded, and the `503
    /// store_unavailable` of `notReadYet` before the state was read.
    func decorate(_ response: HTTPResponse, health: StoreHealth) -> HTTPResponse {
        switch health {
        case .ok:
            return response
        case .degraded:
            var stale = response
            stale.headers.add("Token-Stale", "true")
            return stale
        case .starting:
            return Self.notReadYet
        }
    }

    /// How a stream starts on this replica: its preamble (`retry:` drawn from `retryMilliseconds`,
    /// so that the subscribers of a replica that stops do not all come back at once) and its floor
    /// (the numeric `lastEventID`, the request's `Last-Event-ID`: no event below it is sent). A
    /// floor above `currentVersion`, the replica's, means the replica is behind the subscriber:
    /// the store is asked to read the state again (`refresh`).
    func streamStart(lastEventID: String?, currentVersion: UInt64) -> (preamble: [UInt8], floor: UInt64?) {
        let floor = Self.lastEventID(lastEventID)
        if let floor, floor > currentVersion { refresh() }
        return (Self.retryPreamble(in: retryMilliseconds), floor)
    }

    /// A `retry:` field with a delay drawn from `range` (milliseconds; by default
    /// `defaultRetryMilliseconds`), to start a stream whose client will come back.
    static func retryPreamble(in range: ClosedRange<Int> = defaultRetryMilliseconds) -> [UInt8] {
        ServerSentEvents.retry(milliseconds: Int.random(in: range))
    }

    /// The numeric `Last-Event-ID` of a request, if it has one (decimal digits only).
    static func lastEventID(_ value: String?) -> UInt64? {
        guard let value, !value.isEmpty, value.utf8.count <= 20,
            value.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
        else { return nil }
        return UInt64(value)
    }
}
