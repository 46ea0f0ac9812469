import ForgePushToken
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A value kept as several copies, each behind its own `Locked`, so that threads that change it
/// often do not wait for one another: each thread works on the copy (the shard) it was given the
/// first time it came, round robin, and keeps it for its life. With at least as many shards as
/// busy threads (libmicrohttpd's daemon threads, the store's), no two of them share a lock; a
/// thread preempted while it holds its shard's lock (a vCPU stolen by the hypervisor) stalls
/// nobody else's writes.
///
/// Readers that need the whole value visit every shard (`forEachShard`); the sum of counters
/// (`ServiceMetrics`) or the same value in every shard (`RouteAccess`'s credentials, replaced in
/// each) is what the callers make of them. A reader visiting the shards one after another sees
/// each shard at a different instant: fine for counters, and for a value replaced shard by
/// shard only when the caller orders what follows after the last shard (as
/// `RouteAccess.replace` does).
///
/// The technique is the striped counter of Java's `LongAdder` and the per-thread counters of
/// high-rate servers; here the stripe is chosen once per thread (a `pthread_key_t` holds the
/// thread's number) instead of by hashing, so a thread's stripe never changes under it.
///
/// Thread-safety: all members may be called from any thread; each shard is a `Locked`, a leaf.
public final class PerThreadLocked<State: Sendable>: Sendable {
    /// Shards made by `init` when none is asked for: more than the threads that take a
    /// service's locks on its hot paths (one daemon thread per online core, at most 8, and the
    /// store's threads).
    public static var defaultShardCount: Int { 16 }

    /// `@usableFromInline` with `withThreadLock` `@inlinable`: the token service's counters take
    /// this lock on every request, and across the module boundary an unspecialised call looked up
    /// `Locked<State>`'s generic metadata each time (docs/performance.md).
    @usableFromInline let shards: [Locked<State>]

    /// `count` shards (at least 1), each starting as `make()`.
    public init(shards count: Int = defaultShardCount, _ make: () -> State) {
        shards = (0..<max(1, count)).map { _ in Locked(make()) }
    }

    /// Runs `body` on the calling thread's shard, under its lock; keep it short.
    @inlinable public func withThreadLock<R: Sendable>(_ body: (inout State) throws -> R) rethrows -> R {
        try shards[ThreadNumber.current % shards.count].withLock(body)
    }

    /// Runs `body` on each shard in turn, under that shard's lock alone.
    public func forEachShard(_ body: (inout State) throws -> Void) rethrows {
        for shard in shards { try shard.withLock(body) }
    }
}

/// The number of the calling thread: 0 for the first thread that asks, 1 for the next, and so
/// on, kept in a thread-specific value (POSIX `pthread_getspecific(3)`).
@usableFromInline enum ThreadNumber {
    /// The key of the thread-specific value: the thread's number plus one (0, no value, means
    /// "not numbered yet"). One key for the process: keys are few (`PTHREAD_KEYS_MAX`).
    static let key: pthread_key_t = {
        var key = pthread_key_t()
        let created = pthread_key_create(&key, nil)
        precondition(created == 0, "pthread_key_create failed: \(created)")
        return key
    }()

    /// The next number to give.
    static let next = Atomic<Int>(0)

    @usableFromInline static var current: Int {
        if let value = pthread_getspecific(key) { return Int(bitPattern: value) - 1 }
        let number = next.wrappingAdd(1, ordering: .relaxed).oldValue & Int(Int32.max)
        _ = pthread_setspecific(key, UnsafeRawPointer(bitPattern: number + 1))
        return number
    }
}
