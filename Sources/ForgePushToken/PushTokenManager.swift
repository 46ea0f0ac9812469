#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

#if canImport(Observation)
    import Observation
#endif

#if canImport(os)
    import os
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Holds an app's APNs device token as lowercase hex text and publishes its changes.
///
/// Feed it the two outcomes of remote-notification registration, as delivered to the app
/// delegate (see Apple's documentation for
/// `application(_:didRegisterForRemoteNotificationsWithDeviceToken:)` and
/// `application(_:didFailToRegisterForRemoteNotificationsWithError:)`):
///
/// ```swift
/// manager.didRegister(deviceToken: deviceToken)   // success: Data from APNs
/// manager.didFailToRegister(error: error)         // failure
/// ```
///
/// Then read ``token``, observe ``tokenStream``, or let
/// ``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)`` keep a server
/// in step with it, told the token's ``APNsEnvironment``.
///
/// Behaviour (the package's contract, as docs/library.md describes it):
/// - A token of N bytes becomes exactly 2N lowercase hex digits, byte order kept, whatever N is.
/// - An empty token is rejected: logged, nothing changes, nothing is emitted.
/// - Subscribers are told only about actual changes of ``token``, in the order ``token`` took
///   them; each subscription first receives the value current when it subscribed.
/// - A failed registration clears a token that was set, and subscribers receive `nil`.
///
/// Thread safety: every member may be used from any thread or task, concurrently (the two
/// registration callbacks not from inside a task-cancellation handler). The state is behind a
/// lock; ``token`` read after ``didRegister(deviceToken:)`` returns reflects that
/// registration.
///
/// Lifetime: open ``tokenStream`` subscriptions do not keep the manager alive. When the manager is
/// deinitialised, every open stream finishes, so `for await` loops over them end.
///
/// Observation: where the platform has it (iOS 17, macOS 14, tvOS 17, watchOS 10, visionOS 1,
/// Linux), the manager is `Observable`, so a SwiftUI view that reads ``token`` is updated when it
/// changes; see ``token``. On older systems the manager works the same without it.
public final class PushTokenManager: Sendable {
    /// Receives the manager's log messages.
    ///
    /// Called synchronously on the thread that made the logged call, never while the manager's
    /// lock is held, so it may call back into the manager. Must be thread-safe.
    ///
    /// - Parameters:
    ///   - level: How serious the event is.
    ///   - message: One line of English text without a trailing newline. It never contains a
    ///     device token.
    public typealias LogHandler = @Sendable (_ level: PushTokenManager.LogLevel, _ message: String) -> Void

    /// The severity of a log message, from least (`debug`) to most (`error`) serious.
    ///
    /// What the manager logs:
    /// - ``warning``: `"rejected an empty device token"` (``didRegister(deviceToken:)`` with no
    ///   bytes).
    /// - ``error``: `"registration failed: <domain> error <code>"` (``didFailToRegister(error:)``).
    /// - ``error``: `"device token upload failed (attempt N): <domain> error <code>; retrying in
    ///   <wait>"` or `"…; a newer value replaces it"`
    ///   (``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``,
    ///   the error named by its domain and code alone, such as `NSURLErrorDomain error -1009`,
    ///   never its description; `the upload asked to retry` for an answer `retry`), `"device token
    ///   sign-out failed (attempt N): …"` for a sign-out, or `"…: the upload gave up; waiting for a
    ///   new value or a re-send"`.
    /// - ``error``: `"APNs environment: <domain> error <code>; assuming production"` (the
    ///   same call, when ``APNsEnvironment/current()`` throws).
    public enum LogLevel: String, Sendable, Comparable {
        /// Diagnostic detail.
        case debug
        /// Normal events worth recording.
        case info
        /// An input was rejected; the manager's state is unchanged.
        case warning
        /// An operation failed.
        case error

        private var severity: Int {
            switch self {
            case .debug: 0
            case .info: 1
            case .warning: 2
            case .error: 3
            }
        }

        /// Whether `lhs` is less serious than `rhs`.
        public static func < (lhs: LogLevel, rhs: LogLevel) -> Bool {
            lhs.severity < rhs.severity
        }
    }

    /// Everything mutable, guarded by one lock.
    struct State: Sendable {
        /// The current token as lowercase hex, or `nil`.
        var token: String?
        /// The open subscriptions, by id.
        var subscribers: [UInt64: AsyncStream<String?>.Continuation] = [:]
        /// The id the next subscription gets.
        var nextID: UInt64 = 0
        /// The description of the error of the last failed registration, while no registration
        /// has succeeded since; why ``token`` is `nil` (see `TokenUpload.registrationError`).
        var registrationError: String?
        /// The mailboxes of the running `uploadTokenChanges` calls, by id, which
        /// `resendToken()` wakes.
        var uploaders: [UInt64: LatestValueMailbox] = [:]
        /// The last `signOut()` (`true`) or `resumeUploads()` (`false`) of this process, given to
        /// upload calls that start later; `nil` when neither was called.
        var uploadsPaused: Bool?
        /// The number of the last sign-out asked (0 before the first); upload calls report which
        /// one they settled.
        var signOutGeneration: UInt64 = 0
        /// The callers of `signOut() async` waiting for their outcome, by id.
        var signOutWaiters: [UInt64: SignOutWaiter] = [:]
    }

    /// A caller of `signOut() async` waiting for the upload calls to settle its sign-out.
    struct SignOutWaiter: Sendable {
        /// The sign-out it waits for; a report of it or of a later one counts.
        let generation: UInt64
        /// The upload calls that have not yet reported, or `nil` when none ran at the call: then
        /// the first report completes it.
        var pending: Set<UInt64>?
        /// The worst outcome reported so far.
        var outcome: SignOutOutcome?
        let continuation: CheckedContinuation<SignOutOutcome, Never>
    }

    // Locking. Two locks, always taken in this order: `delivery`, then `state`.
    //
    // - `state` guards `State`. Its critical sections are short and never call out: no `yield` to
    //   a stream someone may be waiting on, no `finish()`, no logging. `onTermination` takes it to
    //   remove its subscriber, and the Swift runtime may run `onTermination` synchronously while
    //   holding the cancelled task's status-record lock (task cancellation runs the handlers of
    //   `withTaskCancellationHandler`, and `AsyncStream`'s `next()` uses one).
    // - Resuming a waiting consumer from `yield` takes that consumer task's status-record lock.
    //   Yielding while holding `state` would therefore invert the order above and deadlock when a
    //   change races with the cancellation of a consumer (seen in this package's stress tests;
    //   see also the note on `onTermination` added by swiftlang/swift#87082).
    // - `delivery` serialises the producers (`didRegister`, `didFailToRegister`) from their state
    //   update through their last `yield`, so every subscriber receives changes in the order
    //   `token` took them, without `yield` ever running under `state`. Nothing takes `delivery`
    //   while holding `state` or a task's status-record lock (unless a caller invokes a producer
    //   from inside a cancellation handler, which the producers' documentation forbids).
    //
    // A subscription's first value is yielded under `state`: the stream was created a moment
    // before and has not been returned, so no consumer can be waiting and `yield` only buffers.

    private let state: Locked<State>
    /// Serialises delivery; holds a reusable list of the continuations being yielded to.
    private let delivery: Locked<[AsyncStream<String?>.Continuation]>
    /// Where log messages go: the app's handler, or the platform's log (``init()``).
    private let logSink: LogSink
    /// An `ObservationRegistrar` where the platform has Observation, else `nil`. Boxed in an
    /// existential because a stored property cannot have a type that is newer than the package's
    /// minimum versions (`ObservationRegistrar` needs iOS 17 / macOS 14 / tvOS 17 / watchOS 10).
    /// The registrar is `Sendable` and does its own locking; the manager never calls it while
    /// holding either of its locks.
    private let observation: (any Sendable)?

    /// Creates a manager with no token (``token`` is `nil`) that logs to the platform's default
    /// destination.
    ///
    /// On Apple platforms messages go to `os.Logger` with subsystem
    /// `"org.forgepushtoken.ForgePushToken"` and category `"PushTokenManager"`; elsewhere each message is one line on standard error, such as
    /// `ForgePushToken warning: rejected an empty device token`.
    public convenience init() {
        self.init(logSink: .system)
    }

    /// Creates a manager with no token (``token`` is `nil`) that sends its log messages to
    /// `logHandler`.
    ///
    /// - Parameter logHandler: Receives every log message; see ``LogHandler`` and ``LogLevel`` for
    ///   what is logged. Use it to route messages into a server's logger or to observe them in
    ///   tests.
    public convenience init(logHandler: @escaping PushTokenManager.LogHandler) {
        self.init(logSink: .handler(logHandler))
    }

    private init(logSink: LogSink) {
        self.state = Locked(State())
        self.delivery = Locked([])
        self.logSink = logSink
        #if canImport(Observation)
            if #available(iOS 17, macOS 14, tvOS 17, watchOS 10, *) {
                self.observation = ObservationRegistrar()
            } else {
                self.observation = nil
            }
        #else
            self.observation = nil
        #endif
    }

    deinit {
        // Take the continuations out under the lock, then finish them after releasing it:
        // `finish()` runs `onTermination` synchronously, and that handler takes the same lock.
        let continuations = state.withLock { state in
            let subscribers = state.subscribers
            state.subscribers = [:]
            return subscribers
        }
        for continuation in continuations.values {
            continuation.finish()
        }
    }

    /// The current device token as lowercase hex, or `nil` if there is none.
    ///
    /// `nil` before the first accepted registration and after a failure that cleared the token.
    /// Otherwise the token from the most recent ``didRegister(deviceToken:)`` with a non-empty
    /// token: N bytes as exactly 2N characters `[0-9a-f]`.
    ///
    /// Thread-safe; a read made after ``didRegister(deviceToken:)`` or
    /// ``didFailToRegister(error:)`` returned (on any thread that has synchronised with that call)
    /// reflects it.
    ///
    /// Observable where the platform has Observation: a read inside a SwiftUI view's `body` or
    /// `withObservationTracking(_:onChange:)` is tracked, and the tracking fires when ``token``
    /// changes value (not when the current token is registered again). As for any `Observable`
    /// property, observers are told before the change (`willSet`, which runs the `onChange` of
    /// `withObservationTracking`) and after it (`didSet`), on the thread that makes the change and
    /// with none of the manager's locks held: an `onChange` handler that reads ``token`` sees the
    /// value being replaced, and may call back into the manager. It should not register a token
    /// synchronously: a change made inside `willSet` reaches the same, not yet cancelled, tracking
    /// again, as it would for a property of an `@Observable` class; start a task instead.
    public var token: String? {
        #if canImport(Observation)
            if #available(iOS 17, macOS 14, tvOS 17, watchOS 10, *),
                let registrar = observation as? ObservationRegistrar
            {
                registrar.access(self, keyPath: \.token)
            }
        #endif
        return state.withLock { $0.token }
    }

    /// A new, independent subscription to the token: its current value, then every change.
    ///
    /// Every access returns a new stream with its own buffer; two `for await` loops over two
    /// accesses both see every value, and values are never split between them.
    ///
    /// - The first element is the value of ``token`` at the moment of the access (`nil` included),
    ///   read and subscribed in one atomic step: a change racing with the subscription is
    ///   delivered exactly once, as the first element or as the second.
    /// - Then one element per change of ``token``, in the order ``token`` took the values. A value
    ///   equal to the previous one is never emitted.
    /// - Each stream buffers at most one undelivered element, the newest: a consumer that falls
    ///   behind skips intermediate values and receives the latest. Memory per subscription is
    ///   bounded.
    /// - The stream finishes when the manager is deinitialised. It does not keep the manager
    ///   alive.
    /// - When the consuming task is cancelled, its loop breaks, or the stream is dropped, the
    ///   subscription is removed at once.
    ///
    /// Thread-safe; may be accessed and iterated from any task.
    public var tokenStream: AsyncStream<String?> {
        let (stream, continuation) = AsyncStream.makeStream(
            of: String?.self,
            bufferingPolicy: .bufferingNewest(1)
        )
        let box = state
        box.withLock { state in
            let id = state.nextID
            state.nextID &+= 1
            // Setting the handler only stores it: nothing can terminate this stream before it is
            // returned (we hold both ends and nobody iterates it yet), so it cannot run here.
            // It captures the box weakly, so a stream does not keep the manager's state alive,
            // and returns the removed continuation so that it is released outside the lock.
            continuation.onTermination = { [weak box] _ in
                _ = box?.withLock { state in state.subscribers.removeValue(forKey: id) }
            }
            state.subscribers[id] = continuation
            // Safe under the lock: nobody can be waiting on this new stream, so this only buffers.
            continuation.yield(state.token)
        }
        return stream
    }

    /// Records a successful registration with APNs.
    ///
    /// Call it from the app delegate's
    /// `application(_:didRegisterForRemoteNotificationsWithDeviceToken:)` (UIKit; AppKit and
    /// WatchKit have equivalents), passing the `deviceToken` unchanged.
    ///
    /// - Parameter deviceToken: The token bytes from APNs, of any non-zero length. N bytes become
    ///   ``token`` as exactly 2N lowercase hex digits, byte order kept.
    ///
    /// An empty `deviceToken` is rejected: a ``LogLevel/warning`` `"rejected an empty device
    /// token"` is logged and nothing changes. A token equal to the current one changes nothing and
    /// emits nothing. Otherwise ``token`` takes the new value and every ``tokenStream``
    /// subscription receives it.
    ///
    /// Thread-safe: callable from any thread or task, except from inside a task-cancellation
    /// handler (`withTaskCancellationHandler`'s `onCancel`, or an `AsyncStream`'s
    /// `onTermination`), where the Swift runtime holds a lock that delivering to a consumer may
    /// need.
    public func didRegister(deviceToken: Data) {
        guard !deviceToken.isEmpty else {
            log(.warning, "rejected an empty device token")
            return
        }
        let hex = DeviceTokenHex.encode(deviceToken)
        publish(hex, registrationError: nil)
    }

    /// Records a failed registration with APNs.
    ///
    /// Call it from the app delegate's
    /// `application(_:didFailToRegisterForRemoteNotificationsWithError:)` (UIKit; AppKit and
    /// WatchKit have equivalents).
    ///
    /// - Parameter error: The error from the system; only its description is used.
    ///
    /// Logs a ``LogLevel/error`` `"registration failed: <domain> error <code>"` (the error's
    /// domain and code only; see ``LogLevel``). If a token was set, ``token``
    /// becomes `nil` and every ``tokenStream`` subscription receives `nil`; if there was none,
    /// nothing changes and nothing is emitted. Either way the error's description is kept until
    /// the next successful registration and given to uploads of `nil`
    /// (``TokenUpload/registrationError``), so that a server can be told why the app has no token.
    ///
    /// Thread-safe: callable from any thread or task, except from inside a task-cancellation
    /// handler (see ``didRegister(deviceToken:)``).
    public func didFailToRegister(error: any Error) {
        log(.error, "registration failed: \(LoggedError.summary(error))", error: error)
        publish(nil, registrationError: "\(error)")
    }

    /// Makes `newToken` the current token and sends it to every subscriber, unless it is the
    /// current token already; records `registrationError` (why the token is `nil`) either way.
    ///
    /// Under `delivery`, so that concurrent calls deliver in the order they changed `token`; the
    /// subscribers are yielded to outside `state` (see the comment on the stored properties).
    ///
    /// Observation's `willSet` is called before the change and `didSet` after it, both with no
    /// lock held, so that an `onChange` handler (which runs inside `willSet`) may read ``token``
    /// (and sees the old value) or call back into the manager. The change is announced from a read
    /// made before taking the locks; if another producer changed ``token`` in between so that this
    /// change was not announced, nothing is changed and the whole step is tried again, so a change
    /// is never made without its `willSet`. A `willSet` whose change another producer made
    /// unnecessary is still balanced by its `didSet` (a spurious notification, never a missed one).
    private func publish(_ newToken: String?, registrationError: String?) {
        while true {
            let announced = state.withLock { $0.token } != newToken
            if announced { observationWillSet() }
            let outcome = delivery.withLock { recipients -> Bool? in
                let changed = state.withLock { state -> Bool? in
                    guard state.token != newToken else {
                        state.registrationError = registrationError
                        return false
                    }
                    // Changed by another producer since the read: announce again first.
                    guard announced else { return nil }
                    state.registrationError = registrationError
                    state.token = newToken
                    recipients.append(contentsOf: state.subscribers.values)
                    return true
                }
                for continuation in recipients {
                    continuation.yield(newToken)
                }
                // Released here, under `delivery` but not under `state`.
                recipients.removeAll(keepingCapacity: true)
                return changed
            }
            if announced { observationDidSet() }
            if outcome != nil { return }
        }
    }

    /// Tells Observation that ``token`` is about to change (fires the `onChange` of
    /// `withObservationTracking`). Called with no lock held.
    private func observationWillSet() {
        #if canImport(Observation)
            if #available(iOS 17, macOS 14, tvOS 17, watchOS 10, *),
                let registrar = observation as? ObservationRegistrar
            {
                registrar.willSet(self, keyPath: \.token)
            }
        #endif
    }

    /// Tells Observation that ``token`` has changed. Called with no lock held.
    private func observationDidSet() {
        #if canImport(Observation)
            if #available(iOS 17, macOS 14, tvOS 17, watchOS 10, *),
                let registrar = observation as? ObservationRegistrar
            {
                registrar.didSet(self, keyPath: \.token)
            }
        #endif
    }

    /// Asks every running upload call, and those that start later, to sign out; registers
    /// `waiter` (an id from `newSignOutWaiterID()` and its continuation) for the outcome. Returns
    /// `true` when the calling task is already cancelled: the sign-out is asked all the same, and
    /// the caller resumes its continuation with `.cancelled` (it was not registered).
    func requestSignOut(waiter: (id: UInt64, continuation: CheckedContinuation<SignOutOutcome, Never>)?) -> Bool {
        let (mailboxes, generation, cancelled) = state.withLock { state in
            state.uploadsPaused = true
            state.signOutGeneration += 1
            // Checked under the lock that `cancelSignOutWaiter` takes: either its handler has run
            // (the flag is set before it runs) or it will find the waiter stored here.
            let cancelled = Task.isCancelled
            if let waiter, !cancelled {
                state.signOutWaiters[waiter.id] = SignOutWaiter(
                    generation: state.signOutGeneration,
                    pending: state.uploaders.isEmpty ? nil : Set(state.uploaders.keys), outcome: nil,
                    continuation: waiter.continuation)
            }
            return (Array(state.uploaders.values), state.signOutGeneration, cancelled)
        }
        for mailbox in mailboxes {
            mailbox.requestSignOut(generation)
        }
        return cancelled
    }

    /// Asks every running upload call, and those that start later, to resume after any sign-out.
    func requestResume() {
        let mailboxes = state.withLock { state in
            state.uploadsPaused = false
            return Array(state.uploaders.values)
        }
        for mailbox in mailboxes {
            mailbox.requestResume()
        }
    }

    /// A new id for a caller of `signOut() async`.
    func newSignOutWaiterID() -> UInt64 {
        state.withLock { state in
            defer { state.nextID &+= 1 }
            return state.nextID
        }
    }

    /// Ends the wait of the caller `id` with `.cancelled` (its task was cancelled).
    func cancelSignOutWaiter(_ id: UInt64) {
        state.withLock { $0.signOutWaiters.removeValue(forKey: id) }?.continuation.resume(returning: .cancelled)
    }

    /// Upload call `uploader` settled sign-out `generation` with `outcome`: the waiters for it or an
    /// earlier one that were waiting for that call take the outcome, and those with nothing more
    /// to wait for are resumed (outside the lock).
    func signOutSettled(uploader: UInt64, generation: UInt64, outcome: SignOutOutcome) {
        let finished = state.withLock { state in
            Self.settle(&state, uploader: uploader, generation: generation, outcome: outcome)
        }
        for (continuation, outcome) in finished {
            continuation.resume(returning: outcome)
        }
    }

    /// The bookkeeping of `signOutSettled` and `removeUploader` (`generation` `nil`: the call
    /// ended; it counts for every waiter that waited for it), under the lock; returns what to
    /// resume.
    private static func settle(
        _ state: inout State, uploader: UInt64, generation: UInt64?, outcome: SignOutOutcome
    ) -> [(CheckedContinuation<SignOutOutcome, Never>, SignOutOutcome)] {
        var finished: [(CheckedContinuation<SignOutOutcome, Never>, SignOutOutcome)] = []
        for (id, var waiter) in state.signOutWaiters {
            if let generation, waiter.generation > generation { continue }
            if var pending = waiter.pending {
                guard pending.remove(uploader) != nil else { continue }
                waiter.pending = pending
            } else if generation == nil {
                continue  // waiting for the first report; a call that ended reported nothing
            }
            let merged = max(waiter.outcome ?? outcome, outcome)
            waiter.outcome = merged
            if waiter.pending?.isEmpty ?? true {
                state.signOutWaiters[id] = nil
                finished.append((waiter.continuation, merged))
            } else {
                state.signOutWaiters[id] = waiter
            }
        }
        return finished
    }

    /// Registers the mailbox of a running `uploadTokenChanges` call, so that `resendToken()`
    /// reaches it; returns the id that `removeUploader(_:)` takes.
    func addUploader(_ mailbox: LatestValueMailbox) -> UInt64 {
        let (id, paused, generation) = state.withLock { state in
            let id = state.nextID
            state.nextID &+= 1
            state.uploaders[id] = mailbox
            return (id, state.uploadsPaused, state.signOutGeneration)
        }
        switch paused {
        case true?: mailbox.requestSignOut(generation)
        case false?: mailbox.requestResume()
        case nil: break
        }
        return id
    }

    /// Removes the mailbox registered as `id`.
    func removeUploader(_ id: UInt64) {
        // The removed mailbox is released outside the lock.
        let (_, finished) = state.withLock { state in
            (
                state.uploaders.removeValue(forKey: id),
                Self.settle(&state, uploader: id, generation: nil, outcome: .cancelled)
            )
        }
        for (continuation, outcome) in finished {
            continuation.resume(returning: outcome)
        }
    }

    /// The mailboxes of the running `uploadTokenChanges` calls.
    var uploaderMailboxes: [LatestValueMailbox] {
        state.withLock { Array($0.uploaders.values) }
    }

    /// Why ``token`` is `nil`, read together with it: the last registration error while the token
    /// is `nil`, else `nil`.
    var registrationErrorIfNoToken: String? {
        state.withLock { $0.token == nil ? $0.registrationError : nil }
    }

    /// The number of callers of `signOut() async` waiting (for tests).
    var signOutWaiterCount: Int {
        state.withLock { $0.signOutWaiters.count }
    }

    /// The number of open ``tokenStream`` subscriptions (for tests).
    var subscriberCount: Int {
        state.withLock { $0.subscribers.count }
    }
}

extension PushTokenManager {
    /// How a sign-out went: the answer of ``PushTokenManager/signOut()->_``.
    ///
    /// Ordered from best to worst (`Comparable`): of several upload calls, the worst is reported.
    /// A value type; `Sendable`.
    public enum SignOutOutcome: Int, Sendable, Hashable, Comparable {
        /// The server was known to hold no token of this device: nothing was sent.
        case nothingToDelete
        /// The sign-out upload answered ``PushTokenManager/UploadOutcome/done``: the server no
        /// longer holds the token.
        case deleted
        /// The wait ended before the sign-out settled: the calling task was cancelled, or an
        /// upload call ended first. The sign-out itself goes on (it is kept in the
        /// ``ServerRecord`` and sent after a relaunch).
        case cancelled
        /// The sign-out upload answered ``PushTokenManager/UploadOutcome/giveUp``: the server may
        /// still hold the token. The sign-out stays owed and is sent again after the next token
        /// change or relaunch, while uploads stay paused.
        case gaveUp

        /// Whether `lhs` is a better outcome than `rhs`.
        public static func < (lhs: SignOutOutcome, rhs: SignOutOutcome) -> Bool {
            lhs.rawValue < rhs.rawValue
        }
    }
}

/// Where a manager's log messages go.
enum LogSink: Sendable {
    /// The app's handler: the message only.
    case handler(PushTokenManager.LogHandler)
    /// The platform's log (``PushTokenManager/init()``).
    case system
}

extension PushTokenManager {
    /// Logs `message` through the manager's sink. `message` names an error by its domain and code
    /// only (``LoggedError/summary(_:)``); `error` itself reaches only the platform's log on Apple
    /// platforms, as private text.
    func log(_ level: LogLevel, _ message: String, error: (any Error)? = nil) {
        switch logSink {
        case .handler(let handler):
            handler(level, message)
        case .system:
            PushTokenManager.systemLog(level, message, error: error)
        }
    }

    /// The `os.Logger` subsystem of ``init()``'s log, in reverse-DNS form as Apple asks
    /// (`Logger.init(subsystem:category:)`); its category is `"PushTokenManager"`.
    static let logSubsystem = "org.forgepushtoken.ForgePushToken"

    #if canImport(os)
        private static let logger = Logger(subsystem: logSubsystem, category: "PushTokenManager")
    #endif

    /// The platform's log, used by ``init()``: `os.Logger` on Apple platforms, standard error
    /// elsewhere.
    ///
    /// On Apple platforms the message (fixed text, counts, durations, an error's domain and code)
    /// is public and the error's description, which may carry a URL, private: the unified log
    /// shows it only where private data is enabled (a debugger attached, or a profile). Elsewhere
    /// the message alone is one line on standard error.
    private static func systemLog(_ level: LogLevel, _ message: String, error: (any Error)?) {
        #if canImport(os)
            let detail = error.map { String(describing: $0) } ?? ""
            switch level {
            case .debug: logger.debug("\(message, privacy: .public) \(detail, privacy: .private)")
            case .info: logger.info("\(message, privacy: .public) \(detail, privacy: .private)")
            case .warning: logger.warning("\(message, privacy: .public) \(detail, privacy: .private)")
            case .error: logger.error("\(message, privacy: .public) \(detail, privacy: .private)")
            }
        #else
            // One write(2) per line, so lines from concurrent calls do not interleave.
            let line = Array(standardErrorLine(level, message).utf8)
            line.withUnsafeBytes { bytes in
                _ = write(STDERR_FILENO, bytes.baseAddress, bytes.count)
            }
        #endif
    }
}

extension PushTokenManager {
    /// The line the default handler writes to standard error where there is no `os.Logger`:
    /// `ForgePushToken <level>: <message>` and a newline. The error itself is not written.
    static func standardErrorLine(_ level: LogLevel, _ message: String) -> String {
        "ForgePushToken \(level.rawValue): \(message)\n"
    }
}

/// How log messages name an error: by its domain and code, which carry no URL and no token, never
/// by its description (a `URLError`'s carries the failing URL; an app's error may quote a token).
enum LoggedError {
    /// `"<domain> error <code>"`, as `NSError` names its errors: `NSURLErrorDomain error -1009`
    /// for a `URLError` (not connected), the qualified type name and case index for a Swift error.
    static func summary(_ error: any Error) -> String {
        "\(error._domain) error \(error._code)"
    }
}

#if canImport(Observation)
    /// `PushTokenManager` participates in Observation where the platform has it: reads of
    /// ``PushTokenManager/token`` are tracked and its changes reported through an
    /// `ObservationRegistrar` (see ``PushTokenManager/token``).
    @available(iOS 17, macOS 14, tvOS 17, watchOS 10, *)
    extension PushTokenManager: Observable {}
#endif
