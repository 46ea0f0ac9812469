import HTTPServing

/// The pending answers (`PendingResponse`) whose connections are suspended now, kept so that a
/// stopping server answers every one of them before libmicrohttpd stops: libmicrohttpd 0.9.75
/// aborts the process when `MHD_stop_daemon` finds a suspended connection ("MHD_stop_daemon()
/// called while we have suspended connections"), and a write whose store never answers (a hung
/// Redis, a state-file save slower than the grace period) would otherwise stay suspended.
///
/// A value, kept by `MicroHTTPDServer.parked` behind its lock: a leaf, taken after a request's
/// `PendingResponse` lock is released (never inside it). Once `close()` has been called it keeps
/// nothing more: `park(_:)` says so, and the engine abandons that answer at once.
///
/// Thread-safety: a value type; its owner's lock guards it.
struct ParkedResponses: Sendable {
    private var entries: [ObjectIdentifier: PendingResponse] = [:]
    /// Whether the server has begun to stop (`close()`).
    private(set) var isClosed = false

    /// The number of answers kept.
    var count: Int { entries.count }

    /// Keeps `pending`, whose connection was just suspended. Returns `false` (keeping nothing)
    /// once closed: the caller answers it at once (`PendingResponse.abandon()`).
    mutating func park(_ pending: PendingResponse) -> Bool {
        guard !isClosed else { return false }
        entries[ObjectIdentifier(pending)] = pending
        return true
    }

    /// Forgets `pending`: its answer was taken, or its request ended.
    mutating func unpark(_ pending: PendingResponse) {
        entries.removeValue(forKey: ObjectIdentifier(pending))
    }

    /// Closes the list and returns what it kept (for `PendingResponse.abandon()`), leaving it
    /// empty. Idempotent: a second call returns nothing.
    mutating func close() -> [PendingResponse] {
        isClosed = true
        defer { entries = [:] }
        return Array(entries.values)
    }
}
