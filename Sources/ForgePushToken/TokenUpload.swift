// Keeping a server in step with the device token: PushTokenManager.uploadTokenChanges(...).
//
// `Clock`, `Duration` and `Clock<Duration>` need iOS 16 / macOS 13 / tvOS 16 / watchOS 9, above
// the package's minimums, so this API is gated with `@available` and the rest of the library keeps
// the older minimums (see docs/library.md, "Platforms and minimum versions").

@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
extension PushTokenManager {
    /// How ``PushTokenManager/uploadTokenChanges(retryPolicy:clock:randomSource:upload:)`` spaces
    /// the retries of a failed upload: exponential backoff with bounded jitter.
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
    /// Retries do not stop by themselves: a token that cannot be uploaded is retried every
    /// ``maximumDelay`` or so until it uploads, a newer value replaces it, or the task is
    /// cancelled.
    ///
    /// A value type; `Sendable`.
    public struct UploadRetryPolicy: Sendable, Hashable {
        /// The base wait before the first retry. Greater than zero.
        public let initialDelay: Duration
        /// The largest base wait; the doubling stops here. At least ``initialDelay``.
        public let maximumDelay: Duration
        /// The largest fraction of a base wait removed at random, in `0...1`. `0` gives the
        /// exact doubling schedule.
        public let jitter: Double

        /// 1 second doubling to 5 minutes, with up to half of each wait removed at random.
        public static let standard = UploadRetryPolicy(
            uncheckedInitialDelay: .seconds(1), maximumDelay: .seconds(300), jitter: 0.5)

        /// A retry policy.
        ///
        /// - Parameters:
        ///   - initialDelay: The base wait before the first retry; must be greater than zero.
        ///   - maximumDelay: The largest base wait; must be at least `initialDelay`.
        ///   - jitter: The largest fraction of a wait removed at random; must be in `0...1`.
        /// - Throws: ``InvalidValue`` naming the first argument out of range; nothing is created.
        public init(initialDelay: Duration, maximumDelay: Duration, jitter: Double) throws {
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
            self.init(uncheckedInitialDelay: initialDelay, maximumDelay: maximumDelay, jitter: jitter)
        }

        private init(uncheckedInitialDelay initialDelay: Duration, maximumDelay: Duration, jitter: Double) {
            self.initialDelay = initialDelay
            self.maximumDelay = maximumDelay
            self.jitter = jitter
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

        /// The error thrown by ``init(initialDelay:maximumDelay:jitter:)`` for an argument out of
        /// range.
        public struct InvalidValue: Error, Sendable, CustomStringConvertible {
            /// Which argument was wrong and why, in English.
            public let description: String
        }
    }

    /// Keeps a server in step with ``tokenStream``, uploading the newest value with `upload`,
    /// retrying failures, until the calling task is cancelled.
    ///
    /// Run it in a task of its own for the app's lifetime and cancel that task to stop:
    ///
    /// ```swift
    /// let uploads = Task {
    ///     await pushTokens.uploadTokenChanges { token in
    ///         try await api.sendDeviceToken(token)  // nil: clear it on the server
    ///     }
    /// }
    /// ```
    ///
    /// What is uploaded:
    /// - The newest value of ``token``. Intermediate values may be skipped, as ``tokenStream``
    ///   conflates them; a value is never uploaded after a newer one.
    /// - `nil` ("clear the token on the server") only after this call has seen a token: the `nil`
    ///   of an app that has no token yet is not uploaded, so a launch never clears the server.
    /// - A value equal to the last one uploaded successfully is not uploaded again.
    ///
    /// How:
    /// - Uploads never overlap: a value that arrives during an upload waits for it to return
    ///   (success or failure) and then goes at once.
    /// - A failed upload (`upload` threw) is retried after the waits of `retryPolicy`, measured
    ///   on `clock`. A newer value ends the wait at once and replaces the failed one, which is
    ///   never uploaded again.
    /// - Each failure is logged through the manager's log handler at ``LogLevel/error``:
    ///   `"device token upload failed (attempt N): <error>; retrying in <wait>"`, or
    ///   `"…; a newer value replaces it"`. Any occurrence of the token's text in the error's
    ///   description is replaced by `<device token>`, so the message never contains a token.
    /// - Cancellation of the calling task ends it promptly: a wait ends at once; an upload in
    ///   flight runs in the calling task and sees the cancellation (`URLSession` stops its
    ///   request), and nothing is uploaded after it returns.
    ///
    /// - Parameters:
    ///   - retryPolicy: The backoff between retries; ``UploadRetryPolicy/standard`` by default
    ///     (1 s doubling to 5 minutes, with jitter).
    ///   - clock: Measures the waits. `ContinuousClock` by default; tests pass a manual clock.
    ///   - randomSource: Draws the jitter, one value per retry. `SystemRandomNumberGenerator` by
    ///     default; tests pass a seeded generator.
    ///   - upload: Sends one value to the server: a token (lowercase hex) or `nil` to clear it.
    ///     Return when the server has it; throw to have it retried. Called from the calling task,
    ///     never concurrently with itself; it should honour cancellation.
    ///
    /// Thread-safe; several calls may run at once (each keeps its own server in step).
    public func uploadTokenChanges(
        retryPolicy: UploadRetryPolicy = .standard,
        clock: some Clock<Duration> = ContinuousClock(),
        randomSource: some RandomNumberGenerator = SystemRandomNumberGenerator(),
        upload: @Sendable (_ token: String?) async throws -> Void
    ) async {
        let mailbox = LatestValueMailbox()
        let stream = tokenStream
        var generator = randomSource
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await value in stream {
                    mailbox.put(value)
                }
            }
            await uploadLoop(
                mailbox: mailbox, retryPolicy: retryPolicy, clock: clock, generator: &generator,
                upload: upload)
            group.cancelAll()
        }
    }

    /// The body of ``uploadTokenChanges(retryPolicy:clock:randomSource:upload:)``: takes values
    /// from `mailbox` until the task is cancelled.
    private func uploadLoop(
        mailbox: LatestValueMailbox,
        retryPolicy: UploadRetryPolicy,
        clock: some Clock<Duration>,
        generator: inout some RandomNumberGenerator,
        upload: @Sendable (String?) async throws -> Void
    ) async {
        var tokenSeen = false
        // What the server holds after our last successful upload; `.none` when unknown (before
        // any success, or once an upload of another value has been attempted).
        var serverHolds: String?? = .none
        while let value = await mailbox.next() {
            if value != nil { tokenSeen = true }
            guard tokenSeen, serverHolds != .some(value) else { continue }
            var attempt = 0
            while !Task.isCancelled {
                attempt += 1
                serverHolds = .none
                do {
                    try await upload(value)
                    serverHolds = .some(value)
                    break
                } catch {
                    if Task.isCancelled { return }
                    let reason = Self.redacted("\(error)", value)
                    if mailbox.hasValue {
                        log(
                            .error,
                            "device token upload failed (attempt \(attempt)): \(reason); a newer value replaces it")
                        break
                    }
                    let wait = retryPolicy.delay(forRetry: attempt, using: &generator)
                    log(.error, "device token upload failed (attempt \(attempt)): \(reason); retrying in \(wait)")
                    await mailbox.waitForValue(atMost: wait, on: clock)
                    if mailbox.hasValue { break }
                }
            }
        }
    }

    /// `text` with every occurrence of `token` replaced by `<device token>`.
    private static func redacted(_ text: String, _ token: String?) -> String {
        guard let token, !token.isEmpty else { return text }
        return text.replacing(token, with: "<device token>")
    }
}

/// Holds the newest undelivered value of a token stream (one slot, so memory is bounded) and lets
/// one task wait for it.
///
/// Thread-safe: its state is behind a lock; continuations are resumed outside it.
final class LatestValueMailbox: Sendable {
    private struct State: Sendable {
        /// The newest value not yet taken; `.none` when empty.
        var value: String?? = .none
        /// The task waiting for a value, if any.
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state = Locked(State())

    /// Whether a value waits to be taken.
    var hasValue: Bool {
        state.withLock { $0.value != nil }
    }

    /// Replaces the waiting value with `value` and wakes the waiting task, if any.
    func put(_ value: String?) {
        let waiter = state.withLock { state in
            state.value = .some(value)
            return state.waiter.take()
        }
        waiter?.resume()
    }

    /// Takes the waiting value, waiting for one if there is none; `nil` once the task is
    /// cancelled.
    func next() async -> String?? {
        while !Task.isCancelled {
            if let value = state.withLock({ $0.value.take() }) {
                return value
            }
            await waitForValue()
        }
        return nil
    }

    /// Returns when a value waits, when `duration` has passed on `clock`, or when the task is
    /// cancelled, whichever comes first.
    @available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
    func waitForValue(atMost duration: Duration, on clock: some Clock<Duration>) async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { try? await clock.sleep(for: duration) }
            group.addTask { await self.waitForValue() }
            await group.next()
            group.cancelAll()
        }
    }

    /// Returns when a value waits or when the task is cancelled. One waiter at a time.
    func waitForValue() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = state.withLock { state in
                    // Checked under the lock that `onCancel` takes: either the handler has run
                    // (the flag is set before it runs) or it will find the waiter stored here.
                    if state.value != nil || Task.isCancelled { return true }
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
