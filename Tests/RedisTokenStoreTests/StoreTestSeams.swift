import ForgePushTokenOwner
import ServerSupport

@testable import RedisTokenStore

// What these tests read of a store beyond `TokenStore`, written once here rather than kept in
// Sources for the tests alone (issue 31, point 7).
extension RedisTokenStore {
    /// The link's own health, as the `redis` field of `/healthz` names it (`connected`,
    /// `unreachable`, `auth_failed`, …): the link decides it before the owner hears of it.
    var linkHealth: String { link.health.rawValue }

    /// The name the store is shared under (`StoreStatus.sharedName`).
    var replicaName: String? { status().sharedName }

    /// The store's series (`StoreStatus.series`: `RedisMetrics` rendered).
    func metricsText() -> String { status().series }

    /// `start(reporting:current:)` for a replica that never had a state to write back.
    func start(reporting report: @escaping @Sendable (TokenStoreEvent) -> Void) {
        start(reporting: report, current: { .initial })
    }
}
