import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

// The `/metrics` page: one of the responder's jobs, assembled here from its five sources.

extension Responder {
    /// `GET /metrics` (docs/operations.md, "Metrics: `GET /metrics`"): the service's counters (`ServiceMetrics`),
    /// the owner's subscribers and the deliveries, whether the state is saved, the drain, the
    /// token sets' sizes, then the store's own series (Redis' in replica mode, else the state
    /// file's writes alone).
    func metricsPage() -> HTTPResponse {
        let store = owner.store.status()
        let stateSaved = store.durableWrites != nil ? owner.health != .degraded(reason: .stateNotSaved) : nil
        let text =
            metrics.render(
                subscribers: owner.subscriberCount, events: deliveries.counts,
                maxSubscribers: owner.maxSubscribers, stateSaved: stateSaved, draining: streams.isDraining,
                tokens: access.current.map { ($0.tokenCount(.read), $0.tokenCount(.write)) } ?? (0, 0))
            + (replica?.metrics() ?? store.metricsText)
        return HTTPResponse(
            status: 200,
            headers: [
                "Content-Type": ServiceMetrics.contentType,
                "Cache-Control": "no-store",
            ],
            body: Array(text.utf8))
    }
}
