#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A value that is only read and written while holding a `pthread_mutex_t`.
///
/// The state and the mutex live together in one `ManagedBuffer` allocation (the state as its
/// header, the mutex as its single element), in the manner of swift-async-algorithms'
/// `Locking.swift`. The mutex is created with `PTHREAD_MUTEX_ERRORCHECK`, so a reentrant
/// ``withLock(_:)`` call stops at a precondition instead of deadlocking silently.
///
/// Why not `Synchronization.Mutex`: on Apple platforms it needs iOS 18 / macOS 15 / tvOS 18 /
/// watchOS 11 / visionOS 2, and this package supports iOS 15 / macOS 12 / tvOS 15 / watchOS 8 /
/// visionOS 1. On Linux it is available, but it locks with priority-inheritance futexes that
/// ThreadSanitizer does not see, so every contended use is reported as a race (a ten-line
/// program shows it), which would hide real reports in this package's and its users'
/// `--sanitize=thread` runs. One implementation everywhere also means the code that runs on
/// Apple platforms is the code compiled and tested on Linux. (No `Mutex` is used in Sources;
/// `TokenOwner`'s outcome slot, which is never contended, is ordered by an atomic instead.)
///
/// Thread safety, and why `@unchecked Sendable` is sound:
/// - A `pthread_mutex_t` must never be moved or copied once initialised. It is initialised in
///   place in the buffer's element storage, which is heap memory at a fixed address for the
///   lifetime of the buffer, and only ever used through that address.
/// - The buffer is created in `init`, stored in a `let`, and never escapes this class, so no other
///   code can reach the state or the mutex.
/// - The state (the buffer's header) is only accessed inside ``withLock(_:)``, between
///   `pthread_mutex_lock` and `pthread_mutex_unlock`, which give mutual exclusion and order each
///   critical section after the previous one.
/// - `State: Sendable` and `R: Sendable`, so values moved into and out of a critical section may
///   be used on any thread.
/// - The mutex is destroyed in the buffer's `deinit`, when no thread can hold a reference.
///
/// `@usableFromInline` with an `@inlinable` `withLock(_:)`: the service's owner reads its state
/// through it on every request, and inlined into the caller's module it is specialised there
/// (docs/performance.md), without `-cross-module-optimization`.
@usableFromInline
package final class Locked<State: Sendable>: @unchecked Sendable {
    /// The heap storage: header = state, one element = the mutex.
    @usableFromInline final class Storage: ManagedBuffer<State, pthread_mutex_t> {
        deinit {
            _ = withUnsafeMutablePointerToElements { mutex in
                pthread_mutex_destroy(mutex)
            }
        }
    }

    @usableFromInline let storage: ManagedBuffer<State, pthread_mutex_t>

    /// Creates a box holding `initial`. `@inlinable`, so that it is specialised where the state's
    /// type is known: there the storage's type metadata comes from a cache filled once, instead
    /// of a look-up in the run time's generic metadata table on every box made (a box per
    /// `TokenSnapshot`, that is per change; docs/performance.md, "What the hot paths avoid").
    @inlinable
    package init(_ initial: State) {
        storage = Storage.create(minimumCapacity: 1) { buffer in
            buffer.withUnsafeMutablePointerToElements { mutex in
                var attributes = pthread_mutexattr_t()
                pthread_mutexattr_init(&attributes)
                pthread_mutexattr_settype(&attributes, Int32(PTHREAD_MUTEX_ERRORCHECK))
                let result = pthread_mutex_init(mutex, &attributes)
                pthread_mutexattr_destroy(&attributes)
                precondition(result == 0, "pthread_mutex_init failed: \(result)")
            }
            return initial
        }
    }

    /// Runs `body` with exclusive access to the state and returns its result.
    ///
    /// Keep `body` short, and never call from it anything that may take the same lock: the lock
    /// is not reentrant.
    @inlinable
    package func withLock<R: Sendable>(_ body: (inout State) throws -> R) rethrows -> R {
        try storage.withUnsafeMutablePointers { state, mutex in
            let locked = pthread_mutex_lock(mutex)
            precondition(locked == 0, "pthread_mutex_lock failed: \(locked)")
            defer {
                let unlocked = pthread_mutex_unlock(mutex)
                precondition(unlocked == 0, "pthread_mutex_unlock failed: \(unlocked)")
            }
            return try body(&state.pointee)
        }
    }
}
