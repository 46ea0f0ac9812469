// Keeping a server in step with the device token: PushTokenManager.uploadTokenChanges(...).
//
// `Clock`, `Duration` and `Clock<Duration>` need iOS 16 / macOS 13 / tvOS 16 / watchOS 9, above
// the package's minimums, so this API is gated with `@available` and the rest of the library keeps
// the older minimums (see docs/library.md, "Platforms and minimum versions").

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
extension PushTokenManager {
    /// How ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
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
    /// An upload that answers ``UploadOutcome/retry(after:)`` with a delay (a server's
    /// `Retry-After`) waits that long instead, capped at ``maximumRequestedDelay`` (one hour by
    /// default) and lengthened by up to ``jitter`` of itself at random, so that the devices a
    /// server told `Retry-After: 120` at the same moment do not all come back at the same moment;
    /// but never less than the backoff wait of that retry, so that `Retry-After: 0`, a date in the
    /// past or `.retry(after: .zero)` is not a storm of immediate retries:
    ///
    /// ```
    /// requested(d, n) = max(min(d, maximumRequestedDelay) × (1 + jitter × u), wait(n))
    /// ```
    ///
    /// with the same `u` for both terms. A requested wait never ends before the server asked (a
    /// server's delay is a "not before"), nor before the backoff of its attempt.
    ///
    /// Retries do not stop by themselves: a token that cannot be uploaded is retried every
    /// ``maximumDelay`` or so until it uploads, a newer value replaces it, the upload answers
    /// ``UploadOutcome/giveUp``, or the task is cancelled.
    ///
    /// With a ``resendInterval`` (24 hours in ``standard``), a value the server accepted is
    /// uploaded again each time that interval passes without a change (Airship, for one, re-sends
    /// its registration every 24 hours, and Firebase recommends refreshing tokens periodically), so
    /// that a server that pruned it gets it back. It is checked while the upload runs, at launch
    /// (counted from ``ServerRecord/acknowledged``) and when the app returns to the foreground
    /// (``PushTokenManager/applicationWillEnterForeground()``).
    ///
    /// A value type; `Sendable`.
    public struct UploadRetryPolicy: Sendable, Hashable {
        /// The base wait before the first retry. Greater than zero.
        public let initialDelay: Duration
        /// The largest base wait; the doubling stops here. At least ``initialDelay``.
        public let maximumDelay: Duration
        /// The largest fraction of a base wait removed at random, and of a requested delay added
        /// at random, in `0...1`. `0` gives the exact doubling schedule and the exact requested
        /// delays.
        public let jitter: Double
        /// The longest delay a ``UploadOutcome/retry(after:)`` (a server's `Retry-After`) is
        /// honoured for, before jitter; one hour in ``standard``. Greater than zero.
        public let maximumRequestedDelay: Duration
        /// How long after a successful upload the same value is uploaded again if nothing changed
        /// (24 hours in ``standard``), or `nil` to upload a value only when it changes or
        /// ``PushTokenManager/resendToken()`` is called. Greater than zero when set.
        public let resendInterval: Duration?

        /// 1 second doubling to 5 minutes, with up to half of each wait removed at random; a
        /// server's requested delay honoured up to one hour, with up to half of it added at random,
        /// and never shorter than the backoff; an unchanged value re-sent every 24 hours. To turn the
        /// re-send off, make a policy with `resendInterval: nil`.
        public static let standard = UploadRetryPolicy(
            uncheckedInitialDelay: .seconds(1), maximumDelay: .seconds(300), jitter: 0.5,
            maximumRequestedDelay: .seconds(3600), resendInterval: .seconds(86_400))

        /// A retry policy.
        ///
        /// - Parameters:
        ///   - initialDelay: The base wait before the first retry; must be greater than zero.
        ///   - maximumDelay: The largest base wait; must be at least `initialDelay`.
        ///   - jitter: The largest fraction of a backoff wait removed at random, and of a requested
        ///     delay added at random; must be in `0...1`.
        ///   - maximumRequestedDelay: The cap on a requested retry delay (`Retry-After`); one hour
        ///     by default; must be greater than zero.
        ///   - resendInterval: Re-send an accepted value after this long without a change; `nil`
        ///     (the default of this initialiser) never does. Must be greater than zero when set;
        ///     `.seconds(86_400)` re-sends daily, as ``standard`` does.
        /// - Throws: ``InvalidValue`` naming the first argument out of range; nothing is created.
        public init(
            initialDelay: Duration, maximumDelay: Duration, jitter: Double,
            maximumRequestedDelay: Duration = .seconds(3600), resendInterval: Duration? = nil
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
            guard maximumRequestedDelay > .zero else {
                throw InvalidValue(
                    description: "maximumRequestedDelay must be greater than zero, got \(maximumRequestedDelay)")
            }
            if let resendInterval, resendInterval <= .zero {
                throw InvalidValue(description: "resendInterval must be greater than zero, got \(resendInterval)")
            }
            self.init(
                uncheckedInitialDelay: initialDelay, maximumDelay: maximumDelay, jitter: jitter,
                maximumRequestedDelay: maximumRequestedDelay, resendInterval: resendInterval)
        }

        private init(
            uncheckedInitialDelay initialDelay: Duration, maximumDelay: Duration, jitter: Double,
            maximumRequestedDelay: Duration, resendInterval: Duration?
        ) {
            self.initialDelay = initialDelay
            self.maximumDelay = maximumDelay
            self.jitter = jitter
            self.maximumRequestedDelay = maximumRequestedDelay
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
            delay(forRetry: retry, requested: nil, using: &generator)
        }

        /// The wait before retry number `retry` when the failed attempt asked for `requested` (a
        /// ``UploadOutcome/retry(after:)`` with a delay, a server's `Retry-After`), drawing one value
        /// from `generator`.
        ///
        /// - Parameters:
        ///   - retry: 1 for the first retry after the first failure, 2 for the next, and so on.
        ///     Values below 1 count as 1.
        ///   - requested: The delay the upload asked for, or `nil` (or negative) for none.
        ///   - generator: The random source; exactly one `next()` is drawn.
        /// - Returns: With no requested delay, the backoff `wait(retry)` of
        ///   ``delay(forRetry:using:)``. Otherwise
        ///   `max(min(requested, maximumRequestedDelay) × (1 + jitter × u), wait(retry))` with the
        ///   same `u`: a requested delay is lengthened by up to ``jitter`` of itself, and is never
        ///   shorter than the backoff of that retry (`Retry-After: 0` waits the backoff).
        public func delay(
            forRetry retry: Int, requested: Duration?, using generator: inout some RandomNumberGenerator
        ) -> Duration {
            var base = initialDelay
            var doublings = max(retry, 1) - 1
            while doublings > 0, base < maximumDelay {
                base = base > maximumDelay / 2 ? maximumDelay : base * 2
                doublings -= 1
            }
            base = min(base, maximumDelay)
            let unit = Double(generator.next() >> 11) * 0x1p-53
            let backoff = base - base * (jitter * unit)
            guard let requested, requested >= .zero else { return backoff }
            let capped = min(requested, maximumRequestedDelay)
            return max(capped + capped * (jitter * unit), backoff)
        }

        /// The error thrown by
        /// ``init(initialDelay:maximumDelay:jitter:maximumRequestedDelay:resendInterval:)`` for an
        /// argument out of range.
        public struct InvalidValue: Error, Sendable, CustomStringConvertible {
            /// Which argument was wrong and why, in English.
            public let description: String
        }
    }

    /// What one upload of
    /// ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
    /// is asked to do: put ``token`` on the server, clear it there when it is `nil`, or, when
    /// ``isSignOut``, remove this device's token from the server because the user signed out.
    ///
    /// A value type; `Sendable`.
    public struct TokenUpload: Sendable, Hashable {
        /// The device token to put on the server, as lowercase hex, or `nil` to clear it there
        /// (the app had a token and has lost it, or ``isSignOut``).
        public let token: String?
        /// The value the server is known to hold: the last value an upload answered
        /// ``UploadOutcome/done`` for, kept across launches by the ``ServerRecordStore``, or `nil`
        /// when none has yet (or the last was a clear or a sign-out).
        ///
        /// Name it in a clear or a sign-out (`DELETE /devices/{serverToken}`) or when replacing a
        /// token (a relaunch with a new token included). An upload of another value that did not
        /// answer ``UploadOutcome/done`` (it threw, asked to retry or gave up) may still have
        /// reached the server.
        public let serverToken: String?
        /// The APNs environment the token belongs to (see ``APNsEnvironment``): the server sends
        /// to the sandbox gateway for ``APNsEnvironment/development`` and to production for
        /// ``APNsEnvironment/production``.
        public let environment: APNsEnvironment
        /// Why ``token`` is `nil`: the description of the error of the failed registration that
        /// cleared it (``PushTokenManager/didFailToRegister(error:)``), or `nil` when the token is
        /// set, no registration has failed since the last success, or ``isSignOut``.
        public let registrationError: String?
        /// Whether this is the sign-out ``PushTokenManager/signOut()->()`` asked for: the server
        /// should no longer hold this device's token (``serverToken``). ``token`` is `nil`.
        public let isSignOut: Bool
        /// Whether the user lets the app show notifications (UserNotifications' authorization
        /// status, read when the upload call starts and when the app returns to the foreground),
        /// or `nil` when it could not be read (outside an app bundle, on Linux) and in a sign-out.
        ///
        /// A change of it uploads the current token again, so that a server can tell a valid
        /// token whose alerts are off (``NotificationAuthorization/denied``) from one that shows
        /// them; that re-upload is not a ``PushTokenManager/tokenStream`` change.
        public let authorization: NotificationAuthorization?

        /// An upload request; the manager makes these, tests of an upload function may too.
        ///
        /// - Parameters:
        ///   - token: The token to upload, or `nil` to clear it.
        ///   - serverToken: The value the server is known to hold, or `nil`.
        ///   - environment: The token's APNs environment.
        ///   - registrationError: Why `token` is `nil`, or `nil`.
        ///   - isSignOut: Whether this is a sign-out (`false` by default).
        ///   - authorization: The notification authorization status, or `nil` (the default) when
        ///     unknown.
        public init(
            token: String?, serverToken: String?, environment: APNsEnvironment, registrationError: String?,
            isSignOut: Bool = false, authorization: NotificationAuthorization? = nil
        ) {
            self.token = token
            self.serverToken = serverToken
            self.environment = environment
            self.registrationError = registrationError
            self.isSignOut = isSignOut
            self.authorization = authorization
        }
    }

    /// How an upload went: the answer of the `upload` function of
    /// ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``.
    ///
    /// Throwing from the upload means the same as ``retry(after:)`` with no delay: the policy's
    /// backoff, logged with the error. ``init(httpStatusCode:retryAfter:now:)`` maps an HTTP answer.
    ///
    /// A value type; `Sendable`.
    public enum UploadOutcome: Sendable, Hashable {
        /// The server has the value. It is not uploaded again until it changes, the app calls
        /// ``PushTokenManager/resendToken()``, or the policy's
        /// ``UploadRetryPolicy/resendInterval`` passes.
        case done
        /// A transient failure: upload the same value again after `after`, at most the policy's
        /// ``UploadRetryPolicy/maximumRequestedDelay`` and lengthened by its jitter, but never
        /// sooner than the policy's backoff wait for that attempt (so `.zero` waits the backoff),
        /// or, when `after` is `nil` or negative, after the backoff wait. A newer value or a re-send
        /// ends the wait of a token's upload at once (not a sign-out's).
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
        /// | `408`, `429`, `5xx` | ``retry(after:)``, after `Retry-After` when it can be read |
        /// | any other `4xx` | ``giveUp`` |
        /// | anything else (`1xx`, `3xx`, out of range) | ``retry(after:)`` with the policy's backoff |
        ///
        /// A network error (the request threw, for example `URLError`) should be thrown from the
        /// upload: it is retried with the policy's backoff.
        ///
        /// - Parameters:
        ///   - httpStatusCode: The answer's status code (`HTTPURLResponse.statusCode`).
        ///   - retryAfter: The answer's `Retry-After` field value, or `nil`. Both forms of RFC 9110
        ///     §10.2.3 are read: delay-seconds (one or more digits, such as `120`; values over a day
        ///     are read as a day) and an HTTP-date (§5.6.7: IMF-fixdate such as
        ///     `Sun, 06 Nov 1994 08:49:37 GMT`, and the obsolete RFC 850 and asctime forms), which
        ///     becomes the time from `now` to that date. A date in the past is no delay; anything
        ///     unreadable falls back to the policy's backoff (`retry(after: nil)`). The policy caps
        ///     and jitters the delay (``UploadRetryPolicy/maximumRequestedDelay``).
        ///   - now: The wall-clock time the answer arrived, for an HTTP-date; the current time by
        ///     default.
        public init(httpStatusCode: Int, retryAfter: String?, now: Date = Date()) {
            switch httpStatusCode {
            case 200..<300:
                self = .done
            case 408, 429, 500..<600:
                self = .retry(after: retryAfter.flatMap { RetryAfter.delay($0, now: now) })
            case 400..<500:
                self = .giveUp
            default:
                self = .retry(after: nil)
            }
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
    /// - A value equal to the one the server holds (the last answered ``UploadOutcome/done``, in
    ///   this launch or, through `serverRecord`, an earlier one) is not uploaded again, unless the
    ///   app calls ``resendToken()``, the policy's ``UploadRetryPolicy/resendInterval`` passes
    ///   (24 hours in ``UploadRetryPolicy/standard``), counted from the acknowledgement's
    ///   wall-clock time (``ServerRecord/acknowledged``) and checked at launch, while running and
    ///   in ``applicationWillEnterForeground()``, or the notification authorization changes.
    /// - Every upload carries the notification authorization status
    ///   (``TokenUpload/authorization``), read from UserNotifications when this call starts and in
    ///   ``applicationWillEnterForeground()``. When it differs from the one the server acknowledged
    ///   (``ServerRecord/authorization``), the current token is uploaded again; ``tokenStream``
    ///   emits nothing for it.
    /// - After a sign-out (``signOut()->()`` or ``signOut()->_``): one sign-out
    ///   (``TokenUpload/isSignOut``), after any upload in flight and with the same retries, then
    ///   nothing until ``resumeUploads()``. A sign-out followed by ``resumeUploads()`` sends the
    ///   sign-out first, then the token, in that order.
    ///
    /// How:
    /// - Uploads never overlap: a value that arrives during an upload waits for it to return
    ///   and then goes at once.
    /// - ``UploadOutcome/retry(after:)`` or a thrown error: the same value is uploaded again after
    ///   the requested delay (capped at ``UploadRetryPolicy/maximumRequestedDelay``, plus jitter,
    ///   and never shorter than the backoff wait of that attempt) or the policy's next backoff
    ///   wait, measured on `clock`. A newer value or a re-send ends the wait of a token's upload at
    ///   once; a replaced value is never uploaded again. A sign-out's wait is not ended by them: it
    ///   is retried until it is done, given up, or the task is cancelled.
    /// - ``UploadOutcome/giveUp``: nothing more is uploaded until the value changes or the app
    ///   calls ``resendToken()``.
    /// - Each failure is logged through the manager's log handler at ``LogLevel/error``:
    ///   `"device token upload failed (attempt N): <error>; retrying in <wait>"` (for an answer
    ///   `retry`, `<error>` is `the upload asked to retry`), `"…; a newer value replaces it"`, or
    ///   `"device token upload failed (attempt N): the upload gave up; waiting for a new value or
    ///   a re-send"` (`device token sign-out failed …` for a sign-out). `<error>` is
    ///   `<domain> error <code>` (such as `NSURLErrorDomain error -1009`), never the error's
    ///   description, which may carry a URL or a token (a `URLError` carries the failing URL).
    /// - On iOS, tvOS and visionOS each attempt runs inside a background task assertion
    ///   (`UIApplication.beginBackgroundTask(withName:expirationHandler:)`, named
    ///   `"ForgePushToken upload"`), ended when the attempt returns or the system expires it, so
    ///   that an upload started during a background launch is not suspended mid-request.
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
    ///     jitter; requested delays up to an hour; no periodic re-send).
    ///   - environment: The APNs environment given to every upload, or `nil` (the default) to
    ///     decide it once, at the start, with ``APNsEnvironment/current()``. If that throws, the
    ///     error is logged at ``LogLevel/error`` (`"APNs environment: <error>; assuming
    ///     production"`) and ``APNsEnvironment/production`` is used.
    ///   - serverRecord: Where what the server holds is kept across launches
    ///     (``ServerRecord``); ``defaultServerRecordStore()`` by default: `UserDefaults` under
    ///     `"ForgePushToken.serverRecord"` on Apple platforms, memory elsewhere. Two calls that
    ///     keep two servers in step need two stores.
    ///   - clock: Measures the waits. `ContinuousClock` by default; tests pass a manual clock.
    ///   - randomSource: Draws the jitter, one value per wait. `SystemRandomNumberGenerator` by
    ///     default; tests pass a seeded generator.
    ///   - isolation: Where `upload` runs: the caller's actor by default (`#isolation`).
    ///   - upload: Sends one ``TokenUpload`` to the server and answers how it went (an
    ///     ``UploadOutcome``; throwing is a transient failure). Called in `isolation`, never
    ///     concurrently with itself; it should honour cancellation.
    ///
    /// Thread-safe; several calls may run at once (each keeps its own server in step).
    @available(iOSApplicationExtension, unavailable)
    @available(tvOSApplicationExtension, unavailable)
    @available(visionOSApplicationExtension, unavailable)
    @available(macCatalystApplicationExtension, unavailable)
    public func uploadTokenChanges(
        retryPolicy: UploadRetryPolicy = .standard,
        environment: APNsEnvironment? = nil,
        serverRecord: any ServerRecordStore = PushTokenManager.defaultServerRecordStore(),
        clock: some Clock<Duration> = ContinuousClock(),
        randomSource: some RandomNumberGenerator = SystemRandomNumberGenerator(),
        isolation: isolated (any Actor)? = #isolation,
        upload: (TokenUpload) async throws -> UploadOutcome
    ) async {
        await uploadTokenChanges(
            retryPolicy: retryPolicy, environment: environment, serverRecord: serverRecord, clock: clock,
            randomSource: randomSource, wallClock: { Date() }, authorization: SystemNotificationAuthorization(),
            isolation: isolation, upload: upload)
    }

    /// ``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
    /// with the wall clock and the authorization status injected (tests).
    @available(iOSApplicationExtension, unavailable)
    @available(tvOSApplicationExtension, unavailable)
    @available(visionOSApplicationExtension, unavailable)
    @available(macCatalystApplicationExtension, unavailable)
    func uploadTokenChanges(
        retryPolicy: UploadRetryPolicy,
        environment: APNsEnvironment?,
        serverRecord: any ServerRecordStore,
        clock: some Clock<Duration>,
        randomSource: some RandomNumberGenerator,
        wallClock: @escaping @Sendable () -> Date,
        authorization: any NotificationAuthorizationReader = SystemNotificationAuthorization(),
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
                manager: self, id: id, mailbox: mailbox, policy: retryPolicy, environment: environment,
                clock: clock, store: serverRecord, wallClock: wallClock, reader: authorization)
            await loop.run(isolation: isolation, generator: &generator, upload: upload)
            group.cancelAll()
        }
    }

    /// Asks every running
    /// ``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
    /// to upload the current value again, although it did not change: after the user logs in, or
    /// when the server has lost it.
    ///
    /// Ends a backoff wait and a ``UploadOutcome/giveUp`` at once; an upload in flight is
    /// followed by one more. Does nothing before the first token (the launch's `nil` is never
    /// uploaded), and nothing while uploads are paused by a sign-out. Returns at once.
    ///
    /// Thread-safe; callable from any thread or task.
    public func resendToken() {
        for mailbox in uploaderMailboxes {
            mailbox.requestResend()
        }
    }

    /// Says that the server should no longer hold this device's token (the user signed out), and
    /// returns at once: fire-and-forget. To know that the deletion reached the server, use
    /// ``signOut()->_`` (`await pushTokens.signOut()`), which an `async` context picks.
    ///
    /// Every running
    /// ``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
    /// finishes the upload in flight, if any, then sends one ``TokenUpload`` with
    /// ``TokenUpload/isSignOut`` set, naming the token the server holds
    /// (``TokenUpload/serverToken``), with the same retry policy and outcomes as any upload; it is
    /// left out when the server is known to hold nothing. Token changes, ``resendToken()`` and
    /// ``resumeUploads()`` do not cut its retries short. After it nothing is uploaded (token
    /// changes and ``resendToken()`` are remembered, not sent) until ``resumeUploads()``, whose
    /// upload goes after the sign-out. The pause is kept in the ``ServerRecord``, so it outlasts a
    /// relaunch, and a sign-out not yet acknowledged is sent after one. A call that starts after
    /// this one starts paused.
    ///
    /// Thread-safe; callable from any thread or task.
    public func signOut() {
        _ = requestSignOut(waiter: nil)
    }

    /// Says that the server should no longer hold this device's token (the user signed out), and
    /// waits until the sign-out has reached the server, has been given up, or the calling task is
    /// cancelled.
    ///
    /// Sends the sign-out as ``signOut()->()`` does. Sign out in this order, so that the
    /// deletion is made with the user's credentials: `await pushTokens.signOut()`, then drop the
    /// credentials (docs/library.md, "Signing out", shows it as compiled code).
    ///
    /// Which calls it waits for: the
    /// ``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
    /// calls running when it is called, each until it has settled this sign-out (or a later one);
    /// when none runs, the first one that starts and settles it.
    ///
    /// - Returns: ``SignOutOutcome/deleted`` when every upload call's sign-out answered
    ///   ``UploadOutcome/done``; ``SignOutOutcome/nothingToDelete`` when their servers were known
    ///   to hold no token (nothing was sent); ``SignOutOutcome/gaveUp`` when a sign-out answered
    ///   ``UploadOutcome/giveUp`` (the server may still hold the token; the sign-out is owed and
    ///   sent again with the next token change or relaunch); ``SignOutOutcome/cancelled`` when the
    ///   calling task was cancelled, or an upload call ended before its sign-out settled. Of several
    ///   upload calls, the worst outcome is returned (given up, cancelled, deleted, nothing to
    ///   delete). Cancelling the calling task ends only the wait: the sign-out itself goes on.
    ///
    /// Thread-safe; callable from any task.
    @discardableResult
    public func signOut() async -> SignOutOutcome {
        let id = newSignOutWaiterID()
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<SignOutOutcome, Never>) in
                if requestSignOut(waiter: (id, continuation)) {
                    continuation.resume(returning: .cancelled)
                }
            }
        } onCancel: {
            cancelSignOutWaiter(id)
        }
    }

    /// Ends the pause of a sign-out (the user signed in again): every running
    /// ``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
    /// first finishes a sign-out it has not yet settled, then uploads the current token, if there is
    /// one, and keeps the server in step again.
    ///
    /// Returns at once. Thread-safe; callable from any thread or task.
    public func resumeUploads() {
        requestResume()
    }

    /// Tells every running
    /// ``uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
    /// that the app returned to the foreground: each reads the notification authorization status
    /// again (``TokenUpload/authorization``) and uploads the current token again when it changed,
    /// or when the policy's ``UploadRetryPolicy/resendInterval`` has passed since the server
    /// acknowledged it (wall clock).
    ///
    /// Call it from `applicationWillEnterForeground(_:)` (UIKit's app delegate),
    /// `sceneWillEnterForeground(_:)` (a scene delegate), or when SwiftUI's `scenePhase` becomes
    /// `.active`; the library observes no notification itself. Returns at once. Thread-safe;
    /// callable from any thread or task.
    public func applicationWillEnterForeground() {
        for mailbox in uploaderMailboxes {
            mailbox.requestForeground()
        }
    }

    /// ``APNsEnvironment/current()``, or `production` after logging why it could not be decided.
    private func decidedEnvironment() -> APNsEnvironment {
        do {
            return try APNsEnvironment.current()
        } catch {
            log(.error, "APNs environment: \(LoggedError.summary(error)); assuming production", error: error)
            return .production
        }
    }
}

/// The state of one
/// ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
/// call, and its loop: takes values, re-send, sign-out, resume and foreground requests from the
/// mailbox and uploads until the task is cancelled.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
@available(iOSApplicationExtension, unavailable)
@available(tvOSApplicationExtension, unavailable)
@available(visionOSApplicationExtension, unavailable)
@available(macCatalystApplicationExtension, unavailable)
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
    /// The id the manager registered this call's mailbox under (its sign-outs are reported by it).
    let id: UInt64
    let mailbox: LatestValueMailbox
    let policy: PushTokenManager.UploadRetryPolicy
    let environment: APNsEnvironment
    let clock: C
    let store: any ServerRecordStore
    let wallClock: @Sendable () -> Date
    let reader: any NotificationAuthorizationReader

    /// The newest value taken from the mailbox; `.none` before the stream's first value.
    var value: String?? = .none
    /// Whether a token has been seen (before that, `nil` is not uploaded).
    var tokenSeen = false
    /// What the server is known to hold, and whether uploads are paused: the persisted record.
    var record: ServerRecord
    /// Whether the server's state is known to be `record.token`: `false` once an upload of
    /// another value has been attempted and not acknowledged. Skips repeated values.
    var recordIsCurrent: Bool
    /// When the periodic re-send of `record.token` is due, on `clock`; `nil` without a
    /// `resendInterval` or while nothing acknowledged is current.
    var resendDue: C.Instant?
    /// The notification authorization status read last, or `nil` before it could be read.
    var authorization: NotificationAuthorization?

    init(
        manager: PushTokenManager, id: UInt64, mailbox: LatestValueMailbox,
        policy: PushTokenManager.UploadRetryPolicy, environment: APNsEnvironment, clock: C,
        store: any ServerRecordStore, wallClock: @escaping @Sendable () -> Date,
        reader: any NotificationAuthorizationReader
    ) {
        self.manager = manager
        self.id = id
        self.mailbox = mailbox
        self.policy = policy
        self.environment = environment
        self.clock = clock
        self.store = store
        self.wallClock = wallClock
        self.reader = reader
        let loaded = store.load()
        // A record of another environment (a development build's record read by a production
        // build) says nothing about this environment's token: it is only named as replaced.
        self.record =
            loaded ?? ServerRecord(token: nil, environment: environment, acknowledged: nil, uploadsPaused: false)
        self.recordIsCurrent = loaded.map { $0.environment == environment } ?? true
        if recordIsCurrent, let interval = policy.resendInterval, let loaded, let acknowledged = loaded.acknowledged {
            self.resendDue = clock.now.advanced(by: Self.remaining(interval, since: acknowledged, now: wallClock()))
        }
    }

    /// What is left of `interval` since `acknowledged` at wall-clock time `now`; a time in the
    /// future (the clock was set back) counts as now.
    static func remaining(_ interval: Duration, since acknowledged: Date, now: Date) -> Duration {
        let elapsed = max(now.timeIntervalSince(acknowledged), 0)
        return max(interval - .milliseconds(Int64(min(elapsed, 1e12) * 1000)), .zero)
    }

    mutating func run(
        isolation: isolated (any Actor)? = #isolation,
        generator: inout some RandomNumberGenerator,
        upload: (PushTokenManager.TokenUpload) async throws -> PushTokenManager.UploadOutcome
    ) async {
        // Read at launch, before the first upload.
        authorization = await reader.read()
        while true {
            // While the server holds the current value, with a periodic re-send, wait at most
            // until it is due.
            var periodic = false
            if !record.uploadsPaused, tokenSeen, recordIsCurrent, let due = resendDue,
                case .some(let current) = value, current == record.token, !mailbox.hasNews
            {
                let wait = clock.now.duration(to: due)
                if wait > .zero { await mailbox.waitForNews(atMost: wait, on: clock) }
                periodic = !mailbox.hasNews
                // Due once: the upload it starts sets the next due time when it is acknowledged.
                if periodic { resendDue = nil }
            }
            let news: LatestValueMailbox.News
            if periodic {
                news = LatestValueMailbox.News(value: .none, resend: true)
            } else {
                guard let taken = await mailbox.next() else { return }
                news = taken
            }
            if Task.isCancelled { return }
            var resend = news.resend
            if news.foreground {
                if let read = await reader.read() { authorization = read }
                // The re-send interval, by the wall clock (the app may have been suspended).
                if recordIsCurrent, let interval = policy.resendInterval, let acknowledged = record.acknowledged,
                    Self.remaining(interval, since: acknowledged, now: wallClock()) == .zero
                {
                    resend = true
                }
            }
            if case .some(let newValue) = news.value {
                value = .some(newValue)
                if newValue != nil { tokenSeen = true }
            }
            var signedOut = false
            if let generation = news.signOut {
                if !record.uploadsPaused {
                    record.uploadsPaused = true
                    store.save(record)
                }
                let outcome = await signOut(isolation: isolation, generator: &generator, upload: upload)
                manager.signOutSettled(uploader: id, generation: generation, outcome: outcome)
                if outcome == .cancelled { return }
                signedOut = true
            }
            if news.resume, record.uploadsPaused {
                record.uploadsPaused = false
                store.save(record)
                if record.token != nil {
                    // Resumed while the server may hold the token without its user (a sign-out
                    // given up): the current value goes again.
                    recordIsCurrent = false
                }
            }
            if record.uploadsPaused {
                // A sign-out is owed while the server may hold a token (after a relaunch, or a
                // sign-out given up and a new value since).
                guard !signedOut, record.token != nil || !recordIsCurrent else { continue }
                if await settle(.signOut, isolation: isolation, generator: &generator, upload: upload) == .cancelled {
                    return
                }
                continue
            }
            guard case .some(let current) = value, tokenSeen else { continue }
            let authorizationChanged = current != nil && authorization != nil && authorization != record.authorization
            guard resend || !recordIsCurrent || record.token != current || authorizationChanged else { continue }
            if await settle(.value(current), isolation: isolation, generator: &generator, upload: upload)
                == .cancelled
            {
                return
            }
        }
    }

    /// Sends the sign-out unless the server is known to hold nothing, and says how it went.
    mutating func signOut(
        isolation: isolated (any Actor)? = #isolation,
        generator: inout some RandomNumberGenerator,
        upload: (PushTokenManager.TokenUpload) async throws -> PushTokenManager.UploadOutcome
    ) async -> PushTokenManager.SignOutOutcome {
        guard record.token != nil || !recordIsCurrent else { return .nothingToDelete }
        switch await settle(.signOut, isolation: isolation, generator: &generator, upload: upload) {
        case .done: return .deleted
        case .gaveUp: return .gaveUp
        case .replaced, .cancelled: return .cancelled
        }
    }

    /// What one ``settle(_:isolation:generator:upload:)`` sends.
    enum Request: Equatable {
        /// The token (or `nil`, a clear).
        case value(String?)
        /// The sign-out.
        case signOut
    }

    /// Uploads `request` until it is done, given up, replaced (a token's upload only: news ends its
    /// wait), or the task is cancelled.
    mutating func settle(
        _ request: Request,
        isolation: isolated (any Actor)? = #isolation,
        generator: inout some RandomNumberGenerator,
        upload: (PushTokenManager.TokenUpload) async throws -> PushTokenManager.UploadOutcome
    ) async -> Settled {
        // A sign-out is not cut short by news: a resume after it goes after it (issue 46).
        let replaceable = request != .signOut
        var attempt = 0
        while !Task.isCancelled {
            attempt += 1
            let message = PushTokenManager.TokenUpload(
                token: request.token, serverToken: record.token, environment: environment,
                registrationError: request == .value(nil) ? manager.registrationErrorIfNoToken : nil,
                isSignOut: request == .signOut, authorization: replaceable ? authorization : nil)
            recordIsCurrent = false
            resendDue = nil
            let reason: String
            let requested: Duration?
            var failure: (any Error)?
            do {
                switch try await BackgroundTime.during({ try await upload(message) }) {
                case .done:
                    record.token = request.token
                    record.environment = environment
                    record.acknowledged = wallClock()
                    record.authorization = message.authorization
                    store.save(record)
                    recordIsCurrent = true
                    resendDue = policy.resendInterval.map { clock.now.advanced(by: $0) }
                    return .done
                case .giveUp:
                    if Task.isCancelled { return .cancelled }
                    manager.log(
                        .error,
                        "device token \(request.noun) failed (attempt \(attempt)): the upload gave up; "
                            + "waiting for a new value or a re-send")
                    return .gaveUp
                case .retry(let after):
                    reason = "the upload asked to retry"
                    requested = after
                }
            } catch {
                reason = LoggedError.summary(error)
                requested = nil
                failure = error
            }
            if Task.isCancelled { return .cancelled }
            if replaceable, mailbox.hasNews {
                let next = mailbox.hasValue ? "a newer value replaces it" : "a re-send was requested"
                manager.log(
                    .error, "device token \(request.noun) failed (attempt \(attempt)): \(reason); \(next)",
                    error: failure)
                return .replaced
            }
            let wait = policy.delay(forRetry: attempt, requested: requested, using: &generator)
            manager.log(
                .error, "device token \(request.noun) failed (attempt \(attempt)): \(reason); retrying in \(wait)",
                error: failure)
            if replaceable {
                await mailbox.waitForNews(atMost: wait, on: clock)
                if mailbox.hasNews { return .replaced }
            } else {
                // Cancellation ends the sleep; the loop's condition sees it.
                try? await clock.sleep(for: wait)
            }
        }
        return .cancelled
    }
}

@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
@available(iOSApplicationExtension, unavailable)
@available(tvOSApplicationExtension, unavailable)
@available(visionOSApplicationExtension, unavailable)
@available(macCatalystApplicationExtension, unavailable)
extension UploadLoop.Request {
    /// The token a request uploads: the value, or `nil` for a sign-out.
    var token: String? {
        switch self {
        case .value(let value): value
        case .signOut: nil
        }
    }

    /// The word for it in log messages.
    var noun: String {
        switch self {
        case .value: "upload"
        case .signOut: "sign-out"
        }
    }
}

/// Holds the newest undelivered value of a token stream (one slot, so memory is bounded) and the
/// requests not yet taken (re-send, sign-out, resume, foreground), and lets one task wait for any.
///
/// Thread-safe: its state is behind a lock; continuations are resumed outside it.
final class LatestValueMailbox: Sendable {
    /// What ``next()`` takes: the newest value, if one arrived, and the requests since the last.
    struct News: Sendable {
        /// The newest value not yet taken, or `.none`.
        var value: String??
        /// Whether ``requestResend()`` was called since the last ``next()``.
        var resend: Bool
        /// The generation of the last ``requestSignOut(_:)`` not yet taken, or `nil`.
        var signOut: UInt64? = nil
        /// Whether ``requestResume()`` was called after that sign-out (or with none pending): the
        /// sign-out, if any, is sent first, then uploads resume.
        var resume = false
        /// Whether ``requestForeground()`` was called since the last ``next()``.
        var foreground = false
    }

    private struct State: Sendable {
        /// The newest value not yet taken; `.none` when empty.
        var value: String?? = .none
        /// Whether a re-send was asked and not yet taken.
        var resend = false
        /// The last sign-out asked and not yet taken.
        var signOut: UInt64?
        /// Whether a resume was asked after it and not yet taken.
        var resume = false
        /// Whether the app returned to the foreground since the last take.
        var foreground = false
        /// The last value put, taken or not (for tests); `.none` before the first.
        var lastPut: String?? = .none
        /// The task waiting for news, if any.
        var waiter: CheckedContinuation<Void, Never>?

        var hasNews: Bool { value != nil || resend || signOut != nil || resume || foreground }
    }

    private let state = Locked(State())

    /// Whether a value waits to be taken.
    var hasValue: Bool {
        state.withLock { $0.value != nil }
    }

    /// The last value put, taken or not; `.none` before the first (for tests).
    var lastPut: String?? {
        state.withLock { $0.lastPut }
    }

    /// Whether a value or a request waits to be taken.
    var hasNews: Bool {
        state.withLock { $0.hasNews }
    }

    /// Applies `change` to the state and wakes the waiting task, if any, after the lock is released.
    private func record(_ change: (inout State) -> Void) {
        let waiter = state.withLock { state in
            change(&state)
            return state.waiter.take()
        }
        waiter?.resume()
    }

    /// Replaces the waiting value with `value` and wakes the waiting task, if any.
    func put(_ value: String?) {
        record { state in
            state.value = .some(value)
            state.lastPut = .some(value)
        }
    }

    /// Records a re-send request and wakes the waiting task, if any.
    func requestResend() {
        record { state in
            state.resend = true
        }
    }

    /// Records sign-out number `generation`, replacing one not yet taken and a resume asked
    /// before it, and wakes the waiting task, if any.
    func requestSignOut(_ generation: UInt64) {
        record { state in
            state.signOut = generation
            state.resume = false
        }
    }

    /// Records a resume, to be done after a sign-out not yet taken, and wakes the waiting task.
    func requestResume() {
        record { state in
            state.resume = true
        }
    }

    /// Records that the app returned to the foreground and wakes the waiting task, if any.
    func requestForeground() {
        record { state in
            state.foreground = true
        }
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
                    state.signOut = nil
                    state.resume = false
                    state.foreground = false
                }
                return News(
                    value: state.value, resend: state.resend, signOut: state.signOut, resume: state.resume,
                    foreground: state.foreground)
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
