import ForgePushTokenOwner
import HTTPServing
import ServerSupport

extension StoreStatus {
    /// The store's series in `/metrics` (docs/operations.md): with a durable copy,
    /// `forge_push_token_state_file_writes_total` (the writes of the state file, each making a
    /// batch of changes durable: beside `forge_push_token_token_changes_total` it shows how many
    /// changes one `fsync` carries); then the store's own families (`series`: Redis'), rendered
    /// here. Complete lines in the Prometheus text format (version 0.0.4), each ending in a line
    /// feed.
    var metricsText: String {
        var text = PrometheusText()
        if let writes = durableWrites {
            text.single(
                "forge_push_token_state_file_writes_total", .counter,
                help:
                    "Writes of the state file (each fsynced), each holding every change decided since the one before.",
                writes)
        }
        for metric in series { text.append(metric) }
        return text.text
    }
}

extension PrometheusText {
    /// Appends a store's family (`StoreMetric`): its HELP and TYPE lines, then each sample, its
    /// label values escaped.
    mutating func append(_ metric: StoreMetric) {
        let type: MetricType =
            switch metric.kind {
            case .counter: .counter
            case .gauge: .gauge
            case .histogram: .histogram
            }
        family(metric.name, type, help: metric.help)
        for sample in metric.samples {
            let labels = sample.labels.map { "\($0.name)=\"\(Self.escapeLabel($0.value))\"" }.joined(separator: ",")
            switch sample.value {
            case .count(let count): self.sample(metric.name + sample.suffix, labels: labels, count)
            case .real(let real): self.sample(metric.name + sample.suffix, labels: labels, real)
            }
        }
    }
}
