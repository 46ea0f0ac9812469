/// The server's one set of conversions of a `Duration` (the service's one clock is
/// `ContinuousClock`) into the units the C calls and the metrics take. Each truncates toward zero
/// but `timeoutMilliseconds`, and none overflows: a negative duration gives 0 where a timeout is
/// asked (a deadline already past), and a huge one clamps.
extension Duration {
    /// Whole microseconds (a request's duration in its record).
    @inlinable public var wholeMicroseconds: Int {
        let (seconds, attoseconds) = components
        return Int(clamping: seconds &* 1_000_000 &+ attoseconds / 1_000_000_000_000)
    }

    /// Whole nanoseconds, at least 0 (a Dispatch wait's timeout).
    @inlinable public var nonNegativeNanoseconds: Int {
        let (seconds, attoseconds) = components
        guard seconds < Int64.max / 1_000_000_000 else { return Int.max }
        return max(0, Int(clamping: seconds * 1_000_000_000 + attoseconds / 1_000_000_000))
    }

    /// Whole milliseconds plus one, from a duration of at least 0, as an `Int32` (an
    /// `epoll_wait(2)` timeout, which must not wake before the deadline).
    @inlinable public var timeoutMilliseconds: Int32 {
        let (seconds, attoseconds) = max(self, .zero).components
        return Int32(clamping: seconds &* 1000 &+ attoseconds / 1_000_000_000_000_000 &+ 1)
    }

    /// Seconds as a `Double` (a drain's schedule, a histogram's observation).
    @inlinable public var inSeconds: Double {
        let (seconds, attoseconds) = components
        return Double(seconds) + Double(attoseconds) / 1e18
    }
}
