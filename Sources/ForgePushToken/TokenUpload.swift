// Keeping a server in step with the device token: PushTokenManager.uploadTokenChanges(...).
//
// `Clock`, `Duration` and `Clock<Duration>` need iOS 16 / macOS 13 / tvOS 16 / watchOS 9, above
// the package's minimums, so this API is gated with `@available` and the rest of the library keeps
// the older minimums (see docs/library.md, "Platforms and minimum versions").

@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
extension PushTokenManager {
    /// How ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:clock:randomSource:isolation:upload:)``
    /// spaces the retries of a failed upload (exponential backoff with bounded jitter), caps a
    /// server's `Retry-After`, and optionally re-sends an unchanged token.
    ///
    /// Before retry *n* (1 for the first retry after the first failure) the wait is
    ///
    /// ```
    /// base(n) = min(initialDelay × 2^(n−1), maximumDelay)
    /// wait(n) = base(n) × (1 − jitter × u),  u uniform in [0, 1)
    /// ```
    ///
    /// so every wait lies in `base(n) × (1 − jitter) ... base(n)` and never exceeds
    /// ``maximumDelay``. ``standard`` waits 1 s, 2 s, 4 s, … up to 5 minutes, each shortened by up
    /// to half at random, so that many devices that failed together do not retry together.
    /// `u` is the top 53 bits of one value of the random source, divided by 2^53.
    ///
    /// An upload that answers ``UploadOutcome/retry(after:)`` with a delay waits that long instead,
    /// at most ``maximumDelay`` (a server's `Retry-After` is honoured up to the policy's cap).
    ///
    /// Retries do not stop by themselves: a token that cannot be uploaded is retried every
    /// ``maximumDelay`` or so until it uploads, a newer value replaces it, the upload answers
    /// ``UploadOutcome/giveUp``, or the task is cancelled.
    ///
    /// With a ``resendInterval``, a value the server accepted is uploaded again each time that
    /// interval passes without a change (Airship, for one, re-sends its registration every 24
    /// hours), so that a server that lost it gets it back.
    ///
    /// A value type; `Sendable`.
    public struct UploadRetryPolicy: Sendable, Hashable {
        /// The base wait before the first retry. Greater than zero.
        public let initialDelay: Duration
        /// The largest base wait; the doubling stops here. At least ``initialDelay``. Also the
        /// longest wait a ``UploadOutcome/retry(after:)`` delay is honoured for.
        public let maximumDelay: Duration
        /// The largest fraction of a base wait removed at random, in `0...1`. `0` gives the
        /// exact doubling schedule.
        public let jitter: Double
        /// How long after a successful upload the same value is uploaded again if nothing changed,
        /// or `nil` (the default) to upload a value only when it changes or
        /// ``PushTokenManager/resendToken()`` is called. Greater than zero when set.
        public let resendInterval: Duration?

        /// 1 second doubling to 5 minutes, with up to half of each wait removed at random; no
        /// periodic re-send.
        public static let standard = UploadRetryPolicy(
            uncheckedInitialDelay: .seconds(1), maximumDelay: .seconds(300), jitter: 0.5, resendInterval: nil)

        /// A retry policy.
        ///
        /// - Parameters:
        ///   - initialDelay: The base wait before the first retry; must be greater than zero.
        ///   - maximumDelay: The largest base wait, and the cap on a requested retry delay; must
        ///     be at least `initialDelay`.
        ///   - jitter: The largest fraction of a wait removed at random; must be in `0...1`.
        ///   - resendInterval: Re-send an accepted value after this long without a change; `nil`
        ///     (the default) never does. Must be greater than zero when set; `.seconds(86_400)`
        ///     re-sends daily.
        /// - Throws: ``InvalidValue`` naming the first argument out of range; nothing is created.
        public init(
            initialDelay: Duration, maximumDelay: Duration, jitter: Double, resendInterval: Duration? = nil
        ) throws {
            guard initialDelay > .zero else {
                throw InvalidValue(description: "initialDelay must be greater than zero, got \(initialDelay)")
            }
            guard maximumDelay >= initialDelay else {
                throw InvalidValue(
                    description: "maximumDelay must be at least initialDelay (\(initialDelay)), got \(maximumDelay)")
            }
            guard jitter >= 0, jitter <= 1 else {
                throw InvalidValue(description: "jitter must be in 0...1, got \(jitter)")
            }
            if let resendInterval, resendInterval <= .zero {
                throw InvalidValue(description: "resendInterval must be greater than zero, got \(resendInterval)")
            }
            self.init(
                uncheckedInitialDelay: initialDelay, maximumDelay: maximumDelay, jitter: jitter,
                resendInterval: resendInterval)
        }

        private init(
            uncheckedInitialDelay initialDelay: Duration, maximumDelay: Duration, jitter: Double,
            resendInterval: Duration?
        ) {
            self.initialDelay = initialDelay
            self.maximumDelay = maximumDelay
            self.jitter = jitter
            self.resendInterval = resendInterval
        }

        /// The wait before retry number `retry`, drawing one value from `generator`.
        ///
        /// - Parameters:
        ///   - retry: 1 for the first retry after the first failure, 2 for the next, and so on.
        ///     Values below 1 count as 1.
        ///   - generator: The random source; exactly one `next()` is drawn.
        /// - Returns: `base(retry) × (1 − jitter × u)` as described on ``UploadRetryPolicy``,
        ///   between `base(retry) × (1 − jitter)` and `base(retry)`.
        public func delay(forRetry retry: Int, using generator: inout some RandomNumberGenerator) -> Duration {
            var base = initialDelay
            var doublings = max(retry, 1) - 1
            while doublings > 0, base < maximumDelay {
                base = base > maximumDelay / 2 ? maximumDelay : base * 2
                doublings -= 1
            }
            base = min(base, maximumDelay)
            let unit = Double(generator.next() >> 11) * 0x1p-53
            return base - base * (jitter * unit)
        }

        /// The error thrown by ``init(initialDelay:maximumDelay:jitter:resendInterval:)`` for an
        /// argument out of range.
        public struct InvalidValue: Error, Sendable, CustomStringConvertible {
            /// Which argument was wrong and why, in English.
            public let description: String
        }
    }

    /// What one upload of
    /// ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:clock:randomSource:isolation:upload:)``
    /// is asked to do: put ``token`` on the server, or clear it there when it is `nil`.
    ///
    /// A value type; `Sendable`.
    public struct TokenUpload: Sendable, Hashable {
        /// The device token to put on the server, as lowercase hex, or `nil` to clear it there
        /// (the app had a token and has lost it).
        public let token: String?
        /// The value the server is known to hold: the last value an upload of this call answered
        /// ``UploadOutcome/done`` for, or `nil` when none has yet (or the last was a clear).
        ///
        /// Name it in a clear (`DELETE /devices/{serverToken}`) or when replacing a token. An
        /// upload of another value that did not answer ``UploadOutcome/done`` (it threw, asked to
        /// retry or gave up) may still have reached the server.
        public let serverToken: String?
        /// The APNs environment the token belongs to (see ``APNsEnvironment``): the server sends
        /// to the sandbox gateway for ``APNsEnvironment/development`` and to production for
        /// ``APNsEnvironment/production``.
        public let environment: APNsEnvironment
        /// Why ``token`` is `nil`: the description of the error of the failed registration that
        /// cleared it (``PushTokenManager/didFailToRegister(error:)``), or `nil` when the token is
        /// set or no registration has failed since the last success.
        public let registrationError: String?

        /// An upload request; the manager makes these, tests of an upload function may too.
        ///
        /// - Parameters:
        ///   - token: The token to upload, or `nil` to clear it.
        ///   - serverToken: The value the server is known to hold, or `nil`.
        ///   - environment: The token's APNs environment.
        ///   - registrationError: Why `token` is `nil`, or `nil`.
        public init(token: String?, serverToken: String?, environment: APNsEnvironment, registrationError: String?) {
            self.token = token
            self.serverToken = serverToken
            self.environment = environment
            self.registrationError = registrationError
        }
    }

    /// How an upload went: the answer of the `upload` function of
    /// ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:clock:randomSource:isolation:upload:)``.
    ///
    /// Throwing from the upload means the same as ``retry(after:)`` with no delay: the policy's
    /// backoff, logged with the error. ``init(httpStatusCode:retryAfter:)`` maps an HTTP answer.
    ///
    /// A value type; `Sendable`.
    public enum UploadOutcome: Sendable, Hashable {
        /// The server has the value. It is not uploaded again until it changes, the app calls
        /// ``PushTokenManager/resendToken()``, or the policy's
        /// ``UploadRetryPolicy/resendInterval`` passes.
        case done
        /// A transient failure: upload the same value again after `after`, at most the policy's
        /// ``UploadRetryPolicy/maximumDelay``, or, when `after` is `nil`, after the policy's next
        /// backoff wait. A newer value or a re-send ends the wait at once.
        case retry(after: Duration? = nil)
        /// A permanent failure (the server refused this value, for example with `400` or
        /// `401`): logged, and nothing more is uploaded until the value changes or the app calls
        /// ``PushTokenManager/resendToken()`` (for example after a log-in).
        case giveUp

        /// The outcome of an HTTP answer to an upload, as RFC 9110 (§15) classifies status codes:
        ///
        /// | status | outcome |
        /// |---|---|
        /// | `2xx` | ``done`` |
        /// | `408`, `429`, `5xx` | ``retry(after:)``, after `Retry-After` when it is delay-seconds |
        /// | any other `4xx` | ``giveUp`` |
        /// | anything else (`1xx`, `3xx`, out of range) | ``retry(after:)`` with the policy's backoff |
        ///
        /// A network error (the request threw, for example `URLError`) should be thrown from the
        /// upload: it is retried with the policy's backoff.
        ///
        /// - Parameters:
        ///   - httpStatusCode: The answer's status code (`HTTPURLResponse.statusCode`).
        ///   - retryAfter: The answer's `Retry-After` field value, or `nil`. Only the
        ///     delay-seconds form (RFC 9110 §10.2.3: one or more digits, such as `120`) is read;
        ///     an HTTP-date or anything else falls back to the policy's backoff.
        public init(httpStatusCode: Int, retryAfter: String?) {
            switch httpStatusCode {
            case 200..<300:
                self = .done
            case 408, 429, 500..<600:
                self = .retry(after: retryAfter.flatMap(Self.delaySeconds))
            case 400..<500:
                self = .giveUp
            default:
                self = .retry(after: nil)
            }
        }

        /// `Retry-After` as delay-seconds (`1*DIGIT`, blanks around it ignored), or `nil`.
        /// Values over a day are read as a day (the policy caps them far below that anyway).
        private static func delaySeconds(_ field: String) -> Duration? {
            let digits = field.utf8.drop { $0 == 0x20 || $0 == 0x09 }.reversed().drop { $0 == 0x20 || $0 == 0x09 }
            guard !digits.isEmpty, digits.allSatisfy({ (0x30...0x39).contains($0) }) else { return nil }
            var seconds: Int64 = 0
            for digit in digits.reversed() {
                seconds = min(seconds * 10 + Int64(digit - 0x30), 86_400)
            }
            return .seconds(seconds)
        }
    }

    /// Keeps a server in step with ``tokenStream``, uploading the newest value with `upload`,
    /// retrying transient failures, until the calling task is cancelled.
    ///
    /// Run it in a task of its own for the app's lifetime and cancel that task to stop:
    ///
    /// ```swift
    /// let uploads = Task {
    ///     await pushTokens.uploadTokenChanges { upload in
    ///         try await api.sendDeviceToken(upload.token, environment: upload.environment)
    ///         return .done
    ///     }
    /// }
    /// ```
    ///
    /// What is uploaded:
    /// - The newest value of ``token``, as a ``TokenUpload`` that also carries the value the server
    ///   is known to hold, the APNs environment and, for `nil`, the registration error.
    ///   Intermediate values may be skipped, as ``tokenStream`` conflates them; a value is never
    ///   uploaded after a newer one.
    /// - `nil` ("clear the token on the server") only after this call has seen a token: the `nil`
    ///   of an app that has no token yet is not uploaded, so a launch never clears the server.
    /// - A value equal to the last one answered ``UploadOutcome/done`` is not uploaded again,
    ///   unless the app calls ``resendToken()`` or the policy's
    ///   ``UploadRetryPolicy/resendInterval`` passes.
    ///
    /// How:
    /// - Uploads never overlap: a value that arrives during an upload waits for it to return
    ///   and then goes at once.
    /// - ``UploadOutcome/retry(after:)`` or a thrown error: the same value is uploaded again after
    ///   the requested delay (capped at ``UploadRetryPolicy/maximumDelay``) or the policy's next
    ///   backoff wait, measured on `clock`. A newer value or a re-send ends the wait at once; a
    ///   replaced value is never uploaded again.
    /// - ``UploadOutcome/giveUp``: nothing more is uploaded until the value changes or the app
    ///   calls ``resendToken()``.
    /// - Each failure is logged through the manager's log handler at ``LogLevel/error``:
    ///   `"device token upload failed (attempt N): <error>; retrying in <wait>"` (for an answer
    ///   `retry`, `<error>` is `the upload asked to retry`), `"…; a newer value replaces it"`, or
    ///   `"device token upload failed (attempt N): the upload gave up; waiting for a new value or
    ///   a re-send"`. Any occurrence of the token's text in an error's description is replaced by
    ///   `<device token>`, so no message contains a token.
    /// - Cancellation of the calling task ends it promptly: a wait ends at once; an upload in
    ///   flight runs in the calling task and sees the cancellation (`URLSession` stops its
    ///   request), and nothing is uploaded after it returns.
    ///
    /// Isolation: `upload` runs in the caller's isolation (the `isolation` parameter, which
    /// defaults to it), so it need not be `@Sendable`: a `@MainActor` model may pass a closure that
    /// uses its main-actor state and API client directly.
    ///
    /// - Parameters:
    ///   - retryPolicy: The backoff between retries, the cap on requested delays, and the periodic
    ///     re-send; ``UploadRetryPolicy/standard`` by default (1 s doubling to 5 minutes, with
    ///     jitter; no periodic re-send).
    ///   - environment: The APNs environment given to every upload, or `nil` (the default) to
    ///     decide it once, at the start, with ``APNsEnvironment/current()``. If that throws, the
    ///     error is logged at ``LogLevel/error`` (`"APNs environment: <error>; assuming
    ///     production"`) and ``APNsEnvironment/production`` is used.
    ///   - clock: Measures the waits. `ContinuousClock` by default; tests pass a manual clock.
    ///   - randomSource: Draws the jitter, one value per backoff wait. `SystemRandomNumberGenerator`
    ///     by default; tests pass a seeded generator.
    ///   - isolation: Where `upload` runs: the caller's actor by default (`#isolation`).
    ///   - upload: Sends one ``TokenUpload`` to the server and answers how it went (an
    ///     ``UploadOutcome``; throwing is a transient failure). Called in `isolation`, never
    ///     concurrently with itself; it should honour cancellation.
    ///
    /// Thread-safe; several calls may run at once (each keeps its own server in step).
    public func uploadTokenChanges(
        retryPolicy: UploadRetryPolicy = .standard,
        environment: APNsEnvironment? = nil,
        clock: some Clock<Duration> = ContinuousClock(),
        randomSource: some RandomNumberGenerator = SystemRandomNumberGenerator(),
        isolation: isolated (any Actor)? = #isolation,
        upload: (TokenUpload) async throws -> UploadOutcome
    ) async {
        let environment = environment ?? decidedEnvironment()
        let mailbox = LatestValueMailbox()
        let id = addUploader(mailbox)
        defer { removeUploader(id) }
        let stream = tokenStream
        var generator = randomSource
        await withTaskGroup(of: Void.self, isolation: isolation) { group in
            group.addTask {
                for await value in stream {
                    mailbox.put(value)
                }
            }
            var loop = UploadLoop(
                manager: self, mailbox: mailbox, policy: retryPolicy, environment: environment, clock: clock)
            await loop.run(isolation: isolation, generator: &generator, upload: upload)
            group.cancelAll()
        }
    }

    /// Asks every running
    /// ``uploadTokenChanges(retryPolicy:environment:clock:randomSource:isolation:upload:)`` to
    /// upload the current value again, although it did not change: after the user logs in, or
    /// when the server has lost it.
    ///
    /// Ends a backoff wait and a ``UploadOutcome/giveUp`` at once; an upload in flight is
    /// followed by one more. Does nothing before the first token (the launch's `nil` is never
    /// uploaded). Returns at once.
    ///
    /// Thread-safe; callable from any thread or task.
    public func resendToken() {
        for mailbox in uploaderMailboxes {
            mailbox.requestResend()
        }
    }

    /// ``APNsEnvironment/current()``, or `production` after logging why it could not be decided.
    private func decidedEnvironment() -> APNsEnvironment {
        do {
            return try APNsEnvironment.current()
        } catch {
            log(.error, "APNs environment: \(error); assuming production")
            return .production
        }
    }
}

/// The state of one
/// ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:clock:randomSource:isolation:upload:)``
/// call, and its loop: takes values and re-send requests from the mailbox and uploads until the
/// task is cancelled.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
private struct UploadLoop<C: Clock<Duration>> {
    /// How uploading one value ended.
    enum Settled {
        /// The upload answered done.
        case done
        /// The upload gave up.
        case gaveUp
        /// A newer value or a re-send request arrived first.
        case replaced
        /// The task was cancelled.
        case cancelled
    }

    let manager: PushTokenManager
    let mailbox: LatestValueMailbox
    let policy: PushTokenManager.UploadRetryPolicy
    let environment: APNsEnvironment
    let clock: C

    /// The newest value taken from the mailbox; `.none` before the stream's first value.
    var value: String?? = .none
    /// Whether a token has been seen (before that, `nil` is not uploaded).
    var tokenSeen = false
    /// The last value answered done, for ``PushTokenManager/TokenUpload/serverToken``.
    var serverToken: String?
    /// What the server holds after our last successful upload; `.none` when unknown (before any
    /// success, or once an upload of another value has been attempted). Skips repeated values.
    var serverHolds: String?? = .none

    mutating func run(
        isolation: isolated (any Actor)? = #isolation,
        generator: inout some RandomNumberGenerator,
        upload: (PushTokenManager.TokenUpload) async throws -> PushTokenManager.UploadOutcome
    ) async {
        var lastSettled: Settled?
        while true {
            // After a success, with a periodic re-send, wait at most the interval for news.
            var periodic = false
            if lastSettled == .done, let interval = policy.resendInterval, !mailbox.hasNews {
                await mailbox.waitForNews(atMost: interval, on: clock)
                periodic = !mailbox.hasNews
            }
            let news: LatestValueMailbox.News
            if periodic {
                news = LatestValueMailbox.News(value: .none, resend: true)
            } else {
                guard let taken = await mailbox.next() else { return }
                news = taken
            }
            if Task.isCancelled { return }
            if case .some(let newValue) = news.value {
                value = .some(newValue)
                if newValue != nil { tokenSeen = true }
            }
            guard case .some(let current) = value, tokenSeen else { continue }
            guard news.resend || serverHolds != .some(current) else { continue }
            lastSettled = await settle(current, isolation: isolation, generator: &generator, upload: upload)
            if lastSettled == .cancelled { return }
        }
    }

    /// Uploads `value` until it is done, given up, replaced, or the task is cancelled.
    mutating func settle(
        _ value: String?,
        isolation: isolated (any Actor)? = #isolation,
        generator: inout some RandomNumberGenerator,
        upload: (PushTokenManager.TokenUpload) async throws -> PushTokenManager.UploadOutcome
    ) async -> Settled {
        var attempt = 0
        while !Task.isCancelled {
            attempt += 1
            serverHolds = .none
            let request = PushTokenManager.TokenUpload(
                token: value, serverToken: serverToken, environment: environment,
                registrationError: value == nil ? manager.registrationErrorIfNoToken : nil)
            let reason: String
            let requested: Duration?
            do {
                switch try await upload(request) {
                case .done:
                    serverHolds = .some(value)
                    serverToken = value
                    return .done
                case .giveUp:
                    if Task.isCancelled { return .cancelled }
                    manager.log(
                        .error,
                        "device token upload failed (attempt \(attempt)): the upload gave up; "
                            + "waiting for a new value or a re-send")
                    return .gaveUp
                case .retry(let after):
                    reason = "the upload asked to retry"
                    requested = after
                }
            } catch {
                reason = Self.redacted("\(error)", value)
                requested = nil
            }
            if Task.isCancelled { return .cancelled }
            if mailbox.hasNews {
                let next = mailbox.hasValue ? "a newer value replaces it" : "a re-send was requested"
                manager.log(.error, "device token upload failed (attempt \(attempt)): \(reason); \(next)")
                return .replaced
            }
            let wait =
                requested.map { min(max($0, .zero), policy.maximumDelay) }
                ?? policy.delay(forRetry: attempt, using: &generator)
            manager.log(.error, "device token upload failed (attempt \(attempt)): \(reason); retrying in \(wait)")
            await mailbox.waitForNews(atMost: wait, on: clock)
            if mailbox.hasNews { return .replaced }
        }
        return .cancelled
    }

    /// `text` with every occurrence of `token` replaced by `<device token>`.
    private static func redacted(_ text: String, _ token: String?) -> String {
        guard let token, !token.isEmpty else { return text }
        return text.replacing(token, with: "<device token>")
    }
}

/// Holds the newest undelivered value of a token stream (one slot, so memory is bounded) and a
/// re-send request, and lets one task wait for either.
///
/// Thread-safe: its state is behind a lock; continuations are resumed outside it.
final class LatestValueMailbox: Sendable {
    /// What ``next()`` takes: the newest value, if one arrived, and whether a re-send was asked.
    struct News: Sendable {
        /// The newest value not yet taken, or `.none`.
        var value: String??
        /// Whether ``requestResend()`` was called since the last ``next()``.
        var resend: Bool
    }

    private struct State: Sendable {
        /// The newest value not yet taken; `.none` when empty.
        var value: String?? = .none
        /// Whether a re-send was asked and not yet taken.
        var resend = false
        /// The task waiting for news, if any.
        var waiter: CheckedContinuation<Void, Never>?

        var hasNews: Bool { value != nil || resend }
    }

    private let state = Locked(State())

    /// Whether a value waits to be taken.
    var hasValue: Bool {
        state.withLock { $0.value != nil }
    }

    /// The value waiting to be taken, `.none` when there is none (for tests).
    var pendingValue: String?? {
        state.withLock { $0.value }
    }

    /// Whether a value or a re-send request waits to be taken.
    var hasNews: Bool {
        state.withLock { $0.hasNews }
    }

    /// Replaces the waiting value with `value` and wakes the waiting task, if any.
    func put(_ value: String?) {
        let waiter = state.withLock { state in
            state.value = .some(value)
            return state.waiter.take()
        }
        waiter?.resume()
    }

    /// Records a re-send request and wakes the waiting task, if any.
    func requestResend() {
        let waiter = state.withLock { state in
            state.resend = true
            return state.waiter.take()
        }
        waiter?.resume()
    }

    /// Takes the waiting news, waiting for some if there is none; `nil` once the task is
    /// cancelled.
    func next() async -> News? {
        while !Task.isCancelled {
            let news = state.withLock { state -> News? in
                guard state.hasNews else { return nil }
                defer {
                    state.value = .none
                    state.resend = false
                }
                return News(value: state.value, resend: state.resend)
            }
            if let news { return news }
            await waitForNews()
        }
        return nil
    }

    /// Returns when news waits, when `duration` has passed on `clock`, or when the task is
    /// cancelled, whichever comes first.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    func waitForNews(atMost duration: Duration, on clock: some Clock<Duration>) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await clock.sleep(for: duration) }
            group.addTask { await self.waitForNews() }
            await group.next()
            group.cancelAll()
        }
    }

    /// Returns when news waits or when the task is cancelled. One waiter at a time.
    func waitForNews() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state in
                    // Checked under the lock that `onCancel` takes: either the handler has run
                    // (the flag is set before it runs) or it will find the waiter stored here.
                    if state.hasNews || Task.isCancelled { return true }
                    precondition(state.waiter == nil, "LatestValueMailbox: two waiters")
                    state.waiter = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            state.withLock { $0.waiter.take() }?.resume()
        }
    }
}
