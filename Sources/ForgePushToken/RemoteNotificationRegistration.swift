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
/// platforms, ``PushTokenManager/registerForRemoteNotifications()`` uses a registrar that calls
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

// The adapters below are a few lines each and have not been compiled: no Apple SDK exists on the
// Linux machines this package is developed and tested on. Each only forwards to the documented
// `registerForRemoteNotifications()` of the platform's shared application object.

#if canImport(UIKit) && !os(watchOS)
/// Calls `UIApplication.shared.registerForRemoteNotifications()` (iOS, iPadOS, tvOS, visionOS,
/// Mac Catalyst). Not compiled on Linux: kept to one obviously right line.
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
    /// which have no shared application.
    ///
    /// Not compiled on Linux (no UIKit there): a one-line adapter over
    /// ``registerForRemoteNotifications(using:)``, which is tested.
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
/// Calls `NSApplication.shared.registerForRemoteNotifications()` (macOS). Not compiled on
/// Linux: kept to one obviously right line.
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
    /// Not compiled on Linux (no AppKit there): a one-line adapter over
    /// ``registerForRemoteNotifications(using:)``, which is tested.
    @available(macOSApplicationExtension, unavailable)
    @MainActor
    public func registerForRemoteNotifications() {
        registerForRemoteNotifications(using: ApplicationRegistrar())
    }
}
#elseif canImport(WatchKit)
/// Calls `WKExtension.shared().registerForRemoteNotifications()` (watchOS; `WKExtension`
/// rather than `WKApplication`, which needs watchOS 9, because this package supports watchOS 8).
/// Not compiled on Linux: kept to one obviously right line.
struct ApplicationRegistrar: RemoteNotificationRegistrar {
    func registerForRemoteNotifications() {
        WKExtension.shared().registerForRemoteNotifications()
    }
}

extension PushTokenManager {
    /// Registers the app for remote notifications by calling
    /// `WKExtension.shared().registerForRemoteNotifications()` on the main actor.
    ///
    /// Returns at once. The outcome arrives through the extension delegate's
    /// `didRegisterForRemoteNotifications(withDeviceToken:)` or
    /// `didFailToRegisterForRemoteNotificationsWithError(_:)`; forward it to
    /// ``didRegister(deviceToken:)`` or ``didFailToRegister(error:)``. See Apple's documentation
    /// for `WKExtension.registerForRemoteNotifications()`.
    ///
    /// Not compiled on Linux (no WatchKit there): a one-line adapter over
    /// ``registerForRemoteNotifications(using:)``, which is tested.
    @MainActor
    public func registerForRemoteNotifications() {
        registerForRemoteNotifications(using: ApplicationRegistrar())
    }
}
#endif
