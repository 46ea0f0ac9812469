#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Something that a batch of wake-ups wakes once at its end, however often it was asked for
/// during it: the event loop that runs many connections (the service's `DaemonLoop`).
///
/// Thread-safety: `wake()` may be called from any thread.
package protocol BatchWakeable: AnyObject, Sendable {
    /// Makes the target run soon (cheap, never blocks).
    func wake()
}

/// Wake-ups coalesced over one piece of work on the calling thread: a delivery that resumes
/// thousands of subscribers, or one run of an event loop. Inside `run(_:)`, `wakeLater(_:)`
/// records each target once, and the targets are woken when `run` returns.
///
/// Why: libmicrohttpd walks every suspended connection of its daemon on each resume round, under
/// the lock that resuming a connection takes (its `resume_suspended_connections`). A delivery
/// that woke a daemon at its first resume had that daemon walk its whole list again and again
/// while the delivery went on, contending with it, at a cost that grows with the square of the
/// subscribers; woken at the end, each daemon walks once.
///
/// Thread-safety: each thread has its own batch (a `pthread_key_t`); nothing is shared.
@usableFromInline
package enum WakeBatch {
    /// The calling thread's batch. Kept behind a raw pointer (one allocation per thread, freed
    /// when the thread ends) rather than in a class: a delivery records a target once per
    /// subscriber, and a class's stored properties are checked for exclusive access at run time
    /// on every read and write, which cost as much as the rest of the recording. Only its own
    /// thread ever reaches it, and every access through the pointer is momentary: no `wake()`
    /// runs while one is in progress (`close()` wakes from a local array), so accesses never
    /// overlap, which the run-time checks no longer enforce; keep it so.
    private struct Pending {
        var open = false
        var targets: [any BatchWakeable] = []
        /// An empty buffer that takes the place of `targets` when the batch ends (see `close()`),
        /// so that neither is copied, and none allocated once both have grown.
        var spare: [any BatchWakeable] = []
    }

    /// Runs `body` with a batch open on this thread; a call inside another's `body` joins the
    /// outer batch. The targets recorded during it are woken once each, after it returns (or
    /// throws).
    @inlinable
    package static func run<R>(_ body: () throws -> R) rethrows -> R {
        guard open() else { return try body() }
        defer { close() }
        return try body()
    }

    /// Records `target` when a batch is open on this thread and returns `true` (it is woken when
    /// the batch ends); returns `false` otherwise, and the caller wakes it itself.
    package static func wakeLater(_ target: any BatchWakeable) -> Bool {
        guard let pending = current(), pending.pointee.open else { return false }
        if !pending.pointee.targets.contains(where: { $0 === target }) { pending.pointee.targets.append(target) }
        return true
    }

    /// This thread's batch, or `nil` when it never opened one.
    private static func current() -> UnsafeMutablePointer<Pending>? {
        pthread_getspecific(key)?.assumingMemoryBound(to: Pending.self)
    }

    /// Opens this thread's batch; `false` when one is open already.
    @usableFromInline
    static func open() -> Bool {
        let pending: UnsafeMutablePointer<Pending>
        if let existing = current() {
            pending = existing
        } else {
            pending = UnsafeMutablePointer<Pending>.allocate(capacity: 1)
            pending.initialize(to: Pending())
            pthread_setspecific(key, pending)
        }
        if pending.pointee.open { return false }
        pending.pointee.open = true
        return true
    }

    /// Closes this thread's batch and wakes its targets. The targets are moved into a local array
    /// first (the batch keeps the spare buffer), so that a target whose `wake()` runs a batch of
    /// its own on this thread (a new batch: this one is closed) neither sees nor empties them.
    @usableFromInline
    static func close() {
        guard let pending = current() else { return }
        pending.pointee.open = false
        // Most daemon runs wake nobody: nothing to move.
        if pending.pointee.targets.isEmpty { return }
        var woken: [any BatchWakeable] = []
        swap(&woken, &pending.pointee.spare)  // the spare buffer, empty
        swap(&woken, &pending.pointee.targets)  // the targets out, the empty buffer in
        for target in woken { target.wake() }
        woken.removeAll(keepingCapacity: true)
        // The buffer back as the spare (unless a batch run by a `wake()` left one there), so that
        // neither buffer is allocated again once both have grown.
        if pending.pointee.spare.capacity < woken.capacity { swap(&pending.pointee.spare, &woken) }
    }

    /// The key of each thread's `Pending`, deinitialized and freed when the thread ends.
    private static let key: pthread_key_t = {
        var key = pthread_key_t()
        let created = pthread_key_create(&key) { pointer in
            #if canImport(Darwin)
                let pending = pointer.assumingMemoryBound(to: Pending.self)
            #else
                guard let pending = pointer?.assumingMemoryBound(to: Pending.self) else { return }
            #endif
            pending.deinitialize(count: 1)
            pending.deallocate()
        }
        precondition(created == 0, "pthread_key_create failed: \(created)")
        return key
    }()
}
