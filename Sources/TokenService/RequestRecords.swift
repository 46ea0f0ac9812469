import ForgePushToken
import HTTPServing
import ServerSupport

/// What the service records of its requests: each finished request counted in the metrics and,
/// with the access log, logged; and what the engine refused on its own. One of the responder's
/// jobs, apart from the handlers.
///
/// Thread-safety: all members may be called from any thread, concurrently (the metrics and the
/// log are).
public final class RequestRecords: Sendable {
    /// The service's counters, served at `GET /metrics`.
    let metrics: ServiceMetrics
    /// Where the access log goes, when `accessLog`.
    let log: ServerLog?
    /// Whether every finished request is logged (`--access-log`).
    public let accessLog: Bool

    /// Records into `metrics`, and, with `accessLog`, into `log`.
    init(metrics: ServiceMetrics, log: ServerLog?, accessLog: Bool) {
        self.metrics = metrics
        self.log = log
        self.accessLog = accessLog
    }

    /// Whether `finished(_:)` logs the peer's address (the JSON access log's `remote`), so that
    /// the engine looks it up only then.
    var logsPeerAddresses: Bool { accessLog && log?.format == .json }

    /// Counts `finished` in the metrics under its route (`label`, the admission's, or, for a
    /// request the engine answered without asking, its path's) and, with `accessLog`, logs it
    /// (`ServerLog.access`).
    func finished(_ finished: FinishedRequest, label: Route?) {
        metrics.recordRequest(
            route: label ?? Route(path: finished.path), method: finished.method, status: finished.status,
            seconds: finished.wasStream ? nil : finished.microseconds.map { Double($0) / 1e6 })
        guard accessLog, let log else { return }
        log.access(
            method: finished.method, path: finished.path, status: finished.status == 0 ? nil : finished.status,
            bytes: finished.bytes, durationMicros: Int64(finished.microseconds ?? 0), remote: finished.remote)
    }

    /// Counts `event` in the metrics (`forge_push_token_connections_refused_total`,
    /// `forge_push_token_request_timeouts_total`).
    func engine(_ event: EngineEvent) {
        switch event {
        case .connectionRefusedTotalLimit: metrics.increment(.connectionsRefusedTotalLimit)
        case .connectionRefusedPerAddressLimit: metrics.increment(.connectionsRefusedPerAddressLimit)
        case .requestTimedOut(let body): metrics.increment(body ? .requestTimeoutsBody : .requestTimeoutsHead)
        }
    }
}
