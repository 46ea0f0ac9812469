/// One metric family a store keeps of its own (`StoreStatus.series`), as values: its name, kind,
/// help text and samples. The owner's module knows no exposition format; the HTTP layer renders
/// these in `/metrics` (Prometheus text, version 0.0.4; docs/operations.md lists the series).
///
/// A value type; `Sendable`.
public struct StoreMetric: Sendable, Equatable {
    /// The family's kind (its `# TYPE`).
    public enum Kind: String, Sendable, Equatable {
        /// A value that only goes up (its name ends in `_total`).
        case counter
        /// A value that goes up and down.
        case gauge
        /// Cumulative buckets (`_bucket{le}`), `_sum` and `_count`.
        case histogram
    }

    /// A sample's value.
    public enum Value: Sendable, Equatable {
        /// A count, written as a whole number.
        case count(UInt64)
        /// A measurement (seconds), written as Swift writes a `Double` (`3.0014`, `1.0`).
        case real(Double)
    }

    /// One label of a sample: its name and its value, unescaped (the renderer escapes it).
    public struct Label: Sendable, Equatable {
        /// The label's name.
        public var name: String
        /// The label's value, as it is.
        public var value: String

        /// A label.
        public init(_ name: String, _ value: String) {
            self.name = name
            self.value = value
        }
    }

    /// One sample: the family's name followed by `suffix` (`""`, or `_bucket`, `_sum`, `_count`
    /// in a histogram), its labels, and its value.
    public struct Sample: Sendable, Equatable {
        /// What follows the family's name in the sample's name.
        public var suffix: String
        /// The labels, in the order written.
        public var labels: [Label]
        /// The value.
        public var value: Value

        /// A sample.
        public init(suffix: String = "", labels: [Label] = [], _ value: Value) {
            self.suffix = suffix
            self.labels = labels
            self.value = value
        }
    }

    /// The family's name.
    public var name: String
    /// Its kind.
    public var kind: Kind
    /// Its help text, one line.
    public var help: String
    /// Its samples, in the order written (a family may have none).
    public var samples: [Sample]

    /// A family.
    public init(_ name: String, _ kind: Kind, help: String, samples: [Sample]) {
        self.name = name
        self.kind = kind
        self.help = help
        self.samples = samples
    }

    /// A family of one unlabelled sample.
    public static func single(_ name: String, _ kind: Kind, help: String, _ value: Value) -> StoreMetric {
        StoreMetric(name, kind, help: help, samples: [Sample(value)])
    }

    /// A histogram family from its bucket bounds and the count in each bucket (not cumulative),
    /// the sum and the count: a cumulative `_bucket{le="BOUND"}` per bound, `le="+Inf"`, then
    /// `_sum` and `_count`.
    public static func histogram(
        _ name: String, help: String, bounds: [Double], buckets: [UInt64], sum: Double, count: UInt64
    ) -> StoreMetric {
        var samples: [Sample] = []
        var cumulative: UInt64 = 0
        for (bound, inBucket) in zip(bounds, buckets) {
            cumulative += inBucket
            samples.append(Sample(suffix: "_bucket", labels: [Label("le", "\(bound)")], .count(cumulative)))
        }
        samples.append(Sample(suffix: "_bucket", labels: [Label("le", "+Inf")], .count(count)))
        samples.append(Sample(suffix: "_sum", .real(sum)))
        samples.append(Sample(suffix: "_count", .count(count)))
        return StoreMetric(name, .histogram, help: help, samples: samples)
    }
}
