import ForgePushTokenOwner
import HTTPServing
import ServerSupport

extension StoreStatus {
    /// The store's series in `/metrics` (docs/operations.md): with a durable copy,
    /// `forge_push_token_state_file_writes_total` (the writes of the state file, each making a
    /// batch of changes durable: beside `forge_push_token_token_changes_total` it shows how many
    /// changes one `fsync` carries); then the series the store rendered itself (`series`: Redis').
    /// Complete lines in the Prometheus text format (version 0.0.4), each ending in a line feed.
    var metricsText: String {
        guard let writes = durableWrites else { return series }
        var text = PrometheusText()
        text.single(
            "forge_push_token_state_file_writes_total", .counter,
            help: "Writes of the state file (each fsynced), each holding every change decided since the one before.",
            writes)
        return text.text + series
    }
}
