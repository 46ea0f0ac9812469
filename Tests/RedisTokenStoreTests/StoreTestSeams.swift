import ForgePushTokenOwner
import ForgePushTokenTestSupport
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

    /// The store's samples (`StoreStatus.series`), one `name{labels} value` line each, as
    /// `/metrics` writes them (the HTTP layer adds each family's HELP and TYPE lines): what these
    /// tests look for.
    func metricsText() -> String { sampleLines(status().series) }

    /// `start(reporting:current:)` for a replica that never had a state to write back.
    func start(reporting report: @escaping @Sendable (TokenStoreEvent) -> Void) {
        start(reporting: report, current: { .initial })
    }
}

/// The sample lines of `series`: `name{labels} value` (labels as written, unescaped: these tests'
/// values need no escaping), each ending in a line feed.
func sampleLines(_ series: [StoreMetric]) -> String {
    series.flatMap { metric in
        metric.samples.map { sample in
            let labels = sample.labels.map { "\($0.name)=\"\($0.value)\"" }.joined(separator: ",")
            let value =
                switch sample.value {
                case .count(let count): count.description
                case .real(let real): real.description
                }
            return metric.name + sample.suffix + (labels.isEmpty ? "" : "{\(labels)}") + " \(value)\n"
        }
    }.joined()
}

/// The project's manual clock, read by the store through `ServerClock.manual(_:)`.
extension ManualServerClock: ServerTimeSource {}
