// Background time for an upload attempt: a UIKit background task assertion on iOS, tvOS and
// visionOS (and Mac Catalyst, where UIKit has it too), nothing elsewhere.

#if canImport(UIKit) && !os(watchOS)
    import UIKit
#endif

/// Runs an upload attempt inside a background task assertion where the platform has one, so that
/// an upload started while the app is in the background (a token delivered during a background
/// launch, say) is not suspended mid-request.
///
/// With UIKit (iOS, iPadOS, tvOS, visionOS, Mac Catalyst): `body` runs between
/// `UIApplication.shared.beginBackgroundTask(withName: "ForgePushToken upload",
/// expirationHandler:)` and `endBackgroundTask(_:)`, which is called once, when `body` returns or
/// throws or when the system calls the expiration handler, whichever comes first (Apple's
/// documentation for `beginBackgroundTask(withName:expirationHandler:)` requires ending it in the
/// handler). Elsewhere (macOS, watchOS, Linux) `body` simply runs. Type-checked against the UIKit
/// stand-in by scripts/check-platform-branches.sh.
@available(iOSApplicationExtension, unavailable)
@available(tvOSApplicationExtension, unavailable)
@available(visionOSApplicationExtension, unavailable)
@available(macCatalystApplicationExtension, unavailable)
enum BackgroundTime {
    /// The assertion's name, as the system's logs and the debugger show it.
    static let name = "ForgePushToken upload"

    /// Runs `body` in the caller's isolation, inside a background task assertion where there is
    /// one; returns what it returns and throws what it throws.
    static func during<R>(
        isolation: isolated (any Actor)? = #isolation, _ body: () async throws -> R
    ) async throws -> R {
        #if canImport(UIKit) && !os(watchOS)
            let assertion = await BackgroundAssertion.begin()
            do {
                let result = try await body()
                await assertion.end()
                return result
            } catch {
                await assertion.end()
                throw error
            }
        #else
            return try await body()
        #endif
    }
}

#if canImport(UIKit) && !os(watchOS)
    /// One background task assertion, ended at most once.
    ///
    /// Main-actor isolated, like `UIApplication`: its identifier is only read and written there,
    /// which also serialises the two ways it ends (the attempt's end, the expiration handler).
    @available(iOSApplicationExtension, unavailable)
    @available(tvOSApplicationExtension, unavailable)
    @available(visionOSApplicationExtension, unavailable)
    @available(macCatalystApplicationExtension, unavailable)
    @MainActor
    final class BackgroundAssertion {
        /// The assertion, or `.invalid` once ended (or when the system refused one).
        private var identifier: UIBackgroundTaskIdentifier = .invalid

        /// Begins an assertion named ``BackgroundTime/name``; the system's expiration handler
        /// ends it.
        static func begin() -> BackgroundAssertion {
            let assertion = BackgroundAssertion()
            assertion.identifier = UIApplication.shared.beginBackgroundTask(withName: BackgroundTime.name) {
                assertion.end()
            }
            return assertion
        }

        /// Ends the assertion unless it has ended.
        func end() {
            guard identifier != .invalid else { return }
            let ending = identifier
            identifier = .invalid
            UIApplication.shared.endBackgroundTask(ending)
        }
    }
#endif
