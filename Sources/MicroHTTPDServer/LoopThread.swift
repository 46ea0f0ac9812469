import CLinuxEvents

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A detached POSIX thread of its own for a loop that blocks for the server's lifetime (a
/// `DaemonLoop` in poll(2), the `SubscriberWatcher` in epoll_wait(2)).
///
/// Why not a Dispatch work item: Dispatch's pool is for work that returns. A work item that
/// blocks for good holds one of its worker threads, and works only because Dispatch happens to
/// start another for the next item; with a loop per core and a watcher, the pool's threads would
/// be the server's. Foundation's `Thread` would do the same as this, with Foundation linked into
/// the engine for it.
///
/// Whoever starts one ends it themselves (each loop has its own stop signal and semaphore).
enum LoopThread {
    /// Starts `body` on a new detached thread named `name` (its first 15 bytes, as `top -H` and
    /// `ps -L` show it).
    /// - Throws: `ServerError.socket` (`call` `pthread_create`) when the thread cannot be made.
    static func detach(name: String, _ body: @escaping @Sendable () -> Void) throws(ServerError) {
        let start = Unmanaged.passRetained(Start(name: name, body: body)).toOpaque()
        var thread = pthread_t()
        let created = pthread_create(
            &thread, nil,
            { argument in
                guard let argument else { return nil }
                let start = Unmanaged<Start>.fromOpaque(argument).takeRetainedValue()
                _ = fpt_name_this_thread(start.name)
                start.body()
                return nil
            }, start)
        guard created == 0 else {
            Unmanaged<Start>.fromOpaque(start).release()
            throw .socket(call: "pthread_create", address: name, errno: created)
        }
        pthread_detach(thread)
    }

    /// What the new thread runs, handed over through `pthread_create`'s argument.
    private final class Start: Sendable {
        let name: String
        let body: @Sendable () -> Void

        init(name: String, body: @escaping @Sendable () -> Void) {
            self.name = name
            self.body = body
        }
    }
}
