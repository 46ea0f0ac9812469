/// The Prometheus text exposition format, version 0.0.4 (Prometheus documentation, "Exposition
/// formats"): the one writer of `/metrics` text, used by the service's series (`ServiceMetrics`,
/// `ProcessMetrics`) and the Redis store's (`RedisMetrics`).
///
/// A family is its `# HELP` and `# TYPE` lines followed by its samples, `name{labels} value`, one
/// per line, each ending in LF. Labels are passed as their text without the braces
/// (`route="/token",method="GET"`); a value that may hold `\`, `"` or LF goes through
/// `escapeLabel` first.
///
/// Thread-safety: a value type; a caller builds one per rendering.
public struct PrometheusText: Sendable {
    /// The `Content-Type` of the text.
    public static let contentType = "text/plain; version=0.0.4; charset=utf-8"

    /// A family's `# TYPE`.
    public enum MetricType: String, Sendable {
        /// A value that only goes up (its name ends in `_total`).
        case counter
        /// A value that goes up and down.
        case gauge
        /// `Histogram`'s series: `_bucket{le}`, `_sum` and `_count`.
        case histogram
    }

    /// The text written so far.
    public private(set) var text = ""

    /// An empty text.
    public init() {}

    /// Appends the `# HELP` and `# TYPE` lines of family `name`.
    public mutating func family(_ name: String, _ type: MetricType, help: String) {
        text += "# HELP \(name) \(help)\n# TYPE \(name) \(type.rawValue)\n"
    }

    /// Appends one sample: `name value`, or `name{labels} value` when `labels` is not empty.
    public mutating func sample(_ name: String, labels: String = "", _ value: some CustomStringConvertible) {
        text += name
        if !labels.isEmpty { text += "{" + labels + "}" }
        text += " " + value.description + "\n"
    }

    /// Appends a family of one unlabelled sample: HELP, TYPE and `name value`.
    public mutating func single(
        _ name: String, _ type: MetricType, help: String, _ value: some CustomStringConvertible
    ) {
        family(name, type, help: help)
        sample(name, value)
    }

    /// Appends the samples of `histogram` as family `name` (its HELP and TYPE written apart, by
    /// `family`, once for every label set): a cumulative `name_bucket{labels,le="BOUND"}` per
    /// bound, `le="+Inf"`, then `name_sum` and `name_count`.
    public mutating func histogram(_ name: String, labels: String = "", _ histogram: Histogram) {
        let prefix = labels.isEmpty ? "" : labels + ","
        var cumulative: UInt64 = 0
        for (bound, count) in zip(histogram.bounds, histogram.buckets) {
            cumulative += count
            sample(name + "_bucket", labels: prefix + "le=\"\(bound)\"", cumulative)
        }
        sample(name + "_bucket", labels: prefix + "le=\"+Inf\"", histogram.count)
        sample(name + "_sum", labels: labels, histogram.sum)
        sample(name + "_count", labels: labels, histogram.count)
    }

    /// `value` escaped as a label value must be: backslash, double quote and line feed.
    public static func escapeLabel(_ value: String) -> String {
        var escaped = ""
        for character in value {
            switch character {
            case "\\": escaped += "\\\\"
            case "\"": escaped += "\\\""
            case "\n": escaped += "\\n"
            default: escaped.append(character)
            }
        }
        return escaped
    }
}

/// A Prometheus histogram of seconds: a count per bucket, the number of observations and their
/// sum. The one histogram type of the service (request durations in `ServiceMetrics`, Redis
/// round trips in `RedisMetrics`); `PrometheusText.histogram` renders it.
///
/// Thread-safety: a value type; its owner keeps it behind a lock.
public struct Histogram: Sendable, Equatable {
    /// Upper bounds of the buckets, in seconds, ascending.
    public let bounds: [Double]
    /// Observations per bucket, not cumulative: `buckets[i]` counts those above `bounds[i - 1]`
    /// and at most `bounds[i]` (the rendering adds them up).
    public private(set) var buckets: [UInt64]
    /// Observations, including those above the last bound.
    public private(set) var count: UInt64 = 0
    /// Their sum, in seconds.
    public private(set) var sum = 0.0

    /// An empty histogram with `bounds` (ascending seconds).
    public init(bounds: [Double]) {
        self.bounds = bounds
        buckets = [UInt64](repeating: 0, count: bounds.count)
    }

    /// The index of the bucket `seconds` falls in among `bounds`, or `nil` above the last: found
    /// before taking the lock that guards a histogram, so that the lock is held only to count.
    @inlinable
    public static func bucket(of seconds: Double, in bounds: [Double]) -> Int? {
        bounds.firstIndex { seconds <= $0 }
    }

    /// Counts an observation of `seconds` that falls in `bucket` (`Histogram.bucket(of:in:)` of
    /// this histogram's bounds).
    public mutating func record(_ seconds: Double, bucket: Int?) {
        if let bucket { buckets[bucket] &+= 1 }
        count &+= 1
        sum += seconds
    }

    /// Counts an observation of `seconds`.
    public mutating func record(_ seconds: Double) {
        record(seconds, bucket: Self.bucket(of: seconds, in: bounds))
    }

    /// Adds `other`'s observations to these (the histograms of several threads' shards made one
    /// for rendering).
    /// - Precondition: `other.bounds == bounds`.
    public mutating func add(_ other: Histogram) {
        precondition(other.bounds == bounds, "histograms with different bounds cannot be added")
        for index in buckets.indices { buckets[index] &+= other.buckets[index] }
        count &+= other.count
        sum += other.sum
    }
}
