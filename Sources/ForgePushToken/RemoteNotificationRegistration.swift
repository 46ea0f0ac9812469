#if canImport(UIKit) && !os(watchOS)
    import UIKit
#elseif canImport(AppKit)
    import AppKit
#elseif canImport(WatchKit)
    import WatchKit
#endif

/// Something that asks the system to register the app with APNs.
///
/// The seam between ``PushTokenManager/registerForRemoteNotifications(using:)`` and the platform's
/// application object, so that the platform-independent part can be tested anywhere. On Apple
/// platforms, `PushTokenManager.registerForRemoteNotifications()` (no argument) uses a registrar that calls
/// the application object's `registerForRemoteNotifications()`.
///
/// Main-actor isolated, like the application objects it stands for. It is not class-constrained:
/// a registrar usually holds no state, so a struct will do.
@MainActor
public protocol RemoteNotificationRegistrar {
    /// Starts registration with APNs. The outcome arrives later, asynchronously, through the app
    /// delegate, which forwards it to ``PushTokenManager/didRegister(deviceToken:)`` or
    /// ``PushTokenManager/didFailToRegister(error:)``.
    func registerForRemoteNotifications()
}

extension PushTokenManager {
    /// Asks `registrar` to register the app for remote notifications, on the main actor.
    ///
    /// Returns at once; the result arrives through the app delegate (see
    /// ``RemoteNotificationRegistrar/registerForRemoteNotifications()``). Nothing is logged.
    ///
    /// - Parameter registrar: What performs the registration; a fake in tests.
    @MainActor
    public func registerForRemoteNotifications(using registrar: some RemoteNotificationRegistrar) {
        registrar.registerForRemoteNotifications()
    }
}

// The adapters below only forward to the documented `registerForRemoteNotifications()` of the
// platform's shared application object. No Apple SDK exists on the Linux machines this package is
// developed on, so scripts/check-platform-branches.sh type-checks each branch against small
// stand-in modules named UIKit, AppKit and WatchKit (Tests/PlatformStandIns/) that declare the
// members called here with Apple's signatures, isolation (`@MainActor` classes) and availability.
// What that proves: each branch is taken when its module can be imported, it compiles in the
// Swift 6 language mode without warnings, the calls match Apple's signatures, and they are made
// on the main actor. What it does not prove: availability (platform attributes are not evaluated
// when compiling for Linux; the ones below were settled from Apple's documentation, cited on each
// adapter) and the behaviour of the real frameworks.

#if canImport(UIKit) && !os(watchOS)
    /// Calls `UIApplication.shared.registerForRemoteNotifications()` (iOS, iPadOS, tvOS, visionOS,
    /// Mac Catalyst).
    ///
    /// Availability, from Apple's documentation: `UIApplication.shared` is unavailable in iOS app
    /// extensions (`NS_EXTENSION_UNAVAILABLE_IOS` in UIApplication.h), and Swift applies an
    /// `iOSApplicationExtension` rule to Mac Catalyst, tvOS and visionOS app extensions too. The four
    /// attributes below state that same rule for each platform explicitly, so they match UIKit's.
    @available(iOSApplicationExtension, unavailable)
    @available(macCatalystApplicationExtension, unavailable)
    @available(tvOSApplicationExtension, unavailable)
    @available(visionOSApplicationExtension, unavailable)
    struct ApplicationRegistrar: RemoteNotificationRegistrar {
        func registerForRemoteNotifications() {
            UIApplication.shared.registerForRemoteNotifications()
        }
    }

    extension PushTokenManager {
        /// Registers the app for remote notifications by calling
        /// `UIApplication.shared.registerForRemoteNotifications()` on the main actor.
        ///
        /// Returns at once. The outcome arrives through the app delegate's
        /// `application(_:didRegisterForRemoteNotificationsWithDeviceToken:)` or
        /// `application(_:didFailToRegisterForRemoteNotificationsWithError:)`; forward it to
        /// ``didRegister(deviceToken:)`` or ``didFailToRegister(error:)``. See Apple's documentation
        /// for `UIApplication.registerForRemoteNotifications()`. Not available in app extensions,
        /// where UIKit makes `UIApplication.shared` unavailable.
        ///
        /// A one-line adapter over ``registerForRemoteNotifications(using:)``.
        @available(iOSApplicationExtension, unavailable)
        @available(macCatalystApplicationExtension, unavailable)
        @available(tvOSApplicationExtension, unavailable)
        @available(visionOSApplicationExtension, unavailable)
        @MainActor
        public func registerForRemoteNotifications() {
            registerForRemoteNotifications(using: ApplicationRegistrar())
        }
    }
#elseif canImport(AppKit)
    /// Calls `NSApplication.shared.registerForRemoteNotifications()` (macOS 10.14 and later, per
    /// Apple's documentation; this package requires macOS 12).
    ///
    /// AppKit does not mark `NSApplication.shared` unavailable in app extensions; this package does,
    /// because an app extension has no application delegate to receive the outcome.
    @available(macOSApplicationExtension, unavailable)
    struct ApplicationRegistrar: RemoteNotificationRegistrar {
        func registerForRemoteNotifications() {
            NSApplication.shared.registerForRemoteNotifications()
        }
    }

    extension PushTokenManager {
        /// Registers the app for remote notifications by calling
        /// `NSApplication.shared.registerForRemoteNotifications()` on the main actor.
        ///
        /// Returns at once. The outcome arrives through the app delegate's
        /// `application(_:didRegisterForRemoteNotificationsWithDeviceToken:)` or
        /// `application(_:didFailToRegisterForRemoteNotificationsWithError:)`; forward it to
        /// ``didRegister(deviceToken:)`` or ``didFailToRegister(error:)``. See Apple's documentation
        /// for `NSApplication.registerForRemoteNotifications()`. Not available in app extensions.
        ///
        /// A one-line adapter over ``registerForRemoteNotifications(using:)``.
        @available(macOSApplicationExtension, unavailable)
        @MainActor
        public func registerForRemoteNotifications() {
            registerForRemoteNotifications(using: ApplicationRegistrar())
        }
    }
#elseif canImport(WatchKit)
    /// Calls `WKApplication.shared().registerForRemoteNotifications()` (watchOS).
    ///
    /// Why `WKApplication`, from Apple's documentation: `WKApplication`, its `shared()` and its
    /// `registerForRemoteNotifications()` are available from watchOS 7.0, below this package's
    /// watchOS 8 minimum, so no `@available` gate is needed; it is the app object of single-target
    /// watchOS apps, the only kind Xcode 14 and later creates. `WKExtension` (the object of the older
    /// two-target, extension-based apps) is deprecated from watchOS 9.2, so calling it would break
    /// the build of an app targeting 9.2 or later with warnings as errors. An extension-based app
    /// calls `WKExtension.shared().registerForRemoteNotifications()` itself, or passes its own
    /// registrar to ``PushTokenManager/registerForRemoteNotifications(using:)``.
    struct ApplicationRegistrar: RemoteNotificationRegistrar {
        func registerForRemoteNotifications() {
            WKApplication.shared().registerForRemoteNotifications()
        }
    }

    extension PushTokenManager {
        /// Registers the app for remote notifications by calling
        /// `WKApplication.shared().registerForRemoteNotifications()` on the main actor.
        ///
        /// Returns at once. The outcome arrives through the app delegate's (`WKApplicationDelegate`)
        /// `didRegisterForRemoteNotifications(withDeviceToken:)` or
        /// `didFailToRegisterForRemoteNotificationsWithError(_:)`; forward it to
        /// ``didRegister(deviceToken:)`` or ``didFailToRegister(error:)``. See Apple's documentation
        /// for `WKApplication.registerForRemoteNotifications()` (watchOS 7.0 and later). For a
        /// single-target watchOS app; an extension-based app passes its own registrar to
        /// ``registerForRemoteNotifications(using:)``.
        ///
        /// A one-line adapter over ``registerForRemoteNotifications(using:)``.
        @MainActor
        public func registerForRemoteNotifications() {
            registerForRemoteNotifications(using: ApplicationRegistrar())
        }
    }
#endif
