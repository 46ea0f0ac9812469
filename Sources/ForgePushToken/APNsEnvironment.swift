#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

#if canImport(UIKit) && !os(watchOS)
    import UIKit
#elseif canImport(AppKit)
    import AppKit
#elseif canImport(WatchKit)
    import WatchKit
#endif

/// The APNs environment a device token belongs to: `development` (the sandbox gateway,
/// `api.sandbox.push.apple.com`) or `production` (`api.push.apple.com`).
///
/// A token is valid only in the environment of the build that received it: a development-signed
/// build (run from Xcode) gets sandbox tokens, an App Store, TestFlight or Ad Hoc build gets
/// production tokens. A server that sends to the wrong gateway gets `400 BadDeviceToken`, so it
/// needs to be told which one a token belongs to: ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``
/// passes it to every upload (``PushTokenManager/TokenUpload/environment``).
///
/// The raw values are the values of Apple's `aps-environment` entitlement (see Apple's
/// documentation, "APS Environment Entitlement").
///
/// How the environment is decided, as Firebase Messaging, Airship and OneSignal do
/// (``decide(provisioningProfile:isSimulator:)``):
/// - in the simulator: ``development``;
/// - no embedded provisioning profile (an App Store or TestFlight build, which Apple re-signs
///   without one): ``production``;
/// - otherwise the profile's entitlement: `Entitlements` → `aps-environment` in
///   `embedded.mobileprovision` (iOS, iPadOS, tvOS, watchOS, visionOS), or `Entitlements` →
///   `com.apple.developer.aps-environment` in `Contents/embedded.provisionprofile` (macOS, Mac
///   Catalyst).
///
/// An app overrides the decision by passing an environment to ``PushTokenManager/uploadTokenChanges(retryPolicy:environment:serverRecord:clock:randomSource:isolation:upload:)``.
///
/// A value type; `Sendable`.
public enum APNsEnvironment: String, Sendable, Hashable, Codable, CaseIterable {
    /// The sandbox: tokens of development-signed builds (`api.sandbox.push.apple.com`).
    case development
    /// Production: tokens of App Store, TestFlight and Ad Hoc builds (`api.push.apple.com`).
    case production

    /// The `aps-environment` entitlement of a provisioning profile, or `nil` when the profile has
    /// none (the app lacks the Push Notifications capability).
    ///
    /// A pure function of the profile's bytes. A profile is a CMS-signed message (Apple's
    /// `embedded.mobileprovision` or `embedded.provisionprofile`) whose content, an XML property
    /// list, is stored in it unchanged; this reads the bytes from the first `<?xml` to the first
    /// `</plist>` after it and decodes them with `PropertyListDecoder`. The signature is not
    /// verified: the system has verified it before the app runs. Thread-safe.
    ///
    /// The entitlement is read from `Entitlements` → `aps-environment` (iOS, iPadOS, tvOS,
    /// watchOS, visionOS) or, when that is absent, `Entitlements` →
    /// `com.apple.developer.aps-environment` (macOS).
    ///
    /// - Parameter profile: The whole file, as read from the app bundle.
    /// - Returns: The environment the entitlement names, or `nil` when the profile has no such
    ///   entitlement.
    /// - Throws: ``ProvisioningProfileError`` when the bytes hold no complete property list, the
    ///   property list is not a profile (no `Entitlements` dictionary), or the entitlement's value
    ///   is neither `development` nor `production`.
    public static func entitlement(inProvisioningProfile profile: Data) throws(ProvisioningProfileError)
        -> APNsEnvironment?
    {
        guard let start = profile.firstRange(of: Data("<?xml".utf8)),
            let end = profile[start.lowerBound...].firstRange(of: Data("</plist>".utf8))
        else {
            throw .noPropertyList
        }
        let plist = profile[start.lowerBound..<end.upperBound]
        let contents: ProfileContents
        do {
            contents = try PropertyListDecoder().decode(ProfileContents.self, from: Data(plist))
        } catch {
            throw .notAProfile("\(error)")
        }
        let entitlements = contents.entitlements
        guard let value = entitlements.apsEnvironment ?? entitlements.macOSAPSEnvironment else {
            return nil
        }
        guard let environment = APNsEnvironment(rawValue: value) else {
            throw .unknownEnvironment(value)
        }
        return environment
    }

    /// The environment of an app's device tokens, from its embedded provisioning profile.
    ///
    /// A pure function (thread-safe), the decision ``current()`` makes from the running app:
    /// - `isSimulator`: ``development`` (the simulator registers with the sandbox);
    /// - no profile (`nil`: an App Store or TestFlight build): ``production``;
    /// - otherwise the profile's entitlement (``entitlement(inProvisioningProfile:)``).
    ///
    /// - Parameters:
    ///   - provisioningProfile: The embedded profile's bytes, or `nil` when the app has none.
    ///   - isSimulator: Whether the app runs in the simulator.
    /// - Throws: ``ProvisioningProfileError`` when the profile cannot be read (see
    ///   ``entitlement(inProvisioningProfile:)``), or ``ProvisioningProfileError/noEntitlement``
    ///   when it has no `aps-environment` entitlement, with which APNs registration fails.
    public static func decide(provisioningProfile: Data?, isSimulator: Bool) throws(ProvisioningProfileError)
        -> APNsEnvironment
    {
        if isSimulator { return .development }
        guard let provisioningProfile else { return .production }
        guard let environment = try entitlement(inProvisioningProfile: provisioningProfile) else {
            throw .noEntitlement
        }
        return environment
    }

    /// The environment of the running app's device tokens, decided from its embedded provisioning
    /// profile by ``decide(provisioningProfile:isSimulator:)``.
    ///
    /// Reads `embedded.mobileprovision` at the root of the main bundle (iOS, iPadOS, tvOS,
    /// watchOS, visionOS) or `Contents/embedded.provisionprofile` in it (macOS, Mac Catalyst) each
    /// time it is called; a missing file means ``production``. Elsewhere (Linux) there is no
    /// profile and no simulator: ``production``.
    ///
    /// Thread-safe; it reads a file, so call it once and keep the result.
    ///
    /// - Throws: ``ProvisioningProfileError`` when the profile exists but cannot be read or has no
    ///   `aps-environment` entitlement (see ``decide(provisioningProfile:isSimulator:)``).
    public static func current() throws(ProvisioningProfileError) -> APNsEnvironment {
        #if targetEnvironment(simulator)
            let isSimulator = true
        #else
            let isSimulator = false
        #endif
        return try current(appBundle: mainBundleURL(), location: .platform, isSimulator: isSimulator)
    }

    /// ``current()`` for the app bundle at `appBundle` with its profile at `location`: the
    /// injectable part of the lookup, tested with fixture bundle folders.
    static func current(appBundle: URL?, location: ProfileLocation?, isSimulator: Bool) throws(ProvisioningProfileError)
        -> APNsEnvironment
    {
        let url = appBundle.flatMap { bundle in location.map { $0.url(in: bundle) } }
        return try decide(provisioningProfile: contents(of: url), isSimulator: isSimulator)
    }

    /// The main bundle's folder, or `nil` where there is no app bundle (Linux).
    private static func mainBundleURL() -> URL? {
        // `Bundle` comes from Foundation, which UIKit, AppKit and WatchKit re-export; on Linux the
        // stand-ins in Tests/PlatformStandIns declare it (scripts/check-platform-branches.sh).
        #if canImport(UIKit) || canImport(AppKit) || canImport(WatchKit)
            return Bundle.main.bundleURL
        #else
            return nil
        #endif
    }

    /// Where an app bundle keeps its embedded provisioning profile.
    enum ProfileLocation {
        /// `embedded.mobileprovision` at the bundle's root (iOS, iPadOS, tvOS, watchOS, visionOS).
        case rootMobileProvision
        /// `Contents/embedded.provisionprofile`, beside `Contents/MacOS` (macOS, Mac Catalyst).
        case contentsProvisionProfile

        /// This platform's location, or `nil` where apps have no profile (Linux).
        static var platform: ProfileLocation? {
            #if canImport(UIKit) && !os(watchOS) && !targetEnvironment(macCatalyst)
                .rootMobileProvision
            #elseif canImport(UIKit) && !os(watchOS) || canImport(AppKit)
                .contentsProvisionProfile
            #elseif canImport(WatchKit)
                .rootMobileProvision
            #else
                nil
            #endif
        }

        /// The profile's URL in the bundle at `bundle`.
        func url(in bundle: URL) -> URL {
            switch self {
            case .rootMobileProvision: bundle.appendingPathComponent("embedded.mobileprovision")
            case .contentsProvisionProfile: bundle.appendingPathComponent("Contents/embedded.provisionprofile")
            }
        }
    }

    /// The bytes of the file at `url`, or `nil` when there is no URL or no such file.
    private static func contents(of url: URL?) throws(ProvisioningProfileError) -> Data? {
        guard let url else { return nil }
        do {
            return try Data(contentsOf: url)
        } catch let error as CocoaError where error.code == .fileReadNoSuchFile {
            return nil
        } catch {
            throw .unreadable("\(error)")
        }
    }
}

/// Why ``APNsEnvironment`` could not be read from a provisioning profile.
///
/// A value type; `Sendable`. ``description`` says what went wrong in English.
public enum ProvisioningProfileError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The bytes hold no `<?xml` … `</plist>`: not a profile, or a file cut short.
    case noPropertyList
    /// The property list could not be decoded as a profile (no `Entitlements` dictionary, or not
    /// valid XML); the decoder's description of the problem.
    case notAProfile(String)
    /// The entitlement names neither `development` nor `production`; the value found.
    case unknownEnvironment(String)
    /// The profile has no `aps-environment` entitlement: add the Push Notifications capability to
    /// the app target (Xcode, Signing & Capabilities).
    case noEntitlement
    /// The profile exists in the app bundle but could not be read; the error's description.
    case unreadable(String)

    /// What went wrong, in one line of English.
    public var description: String {
        switch self {
        case .noPropertyList:
            "the provisioning profile holds no property list (<?xml … </plist>)"
        case .notAProfile(let reason):
            "the provisioning profile's property list is not a profile (no Entitlements dictionary, "
                + "or not a valid property list): \(reason)"
        case .unknownEnvironment(let value):
            "the aps-environment entitlement is \"\(value)\", neither development nor production"
        case .noEntitlement:
            "the provisioning profile has no aps-environment entitlement "
                + "(add the Push Notifications capability to the app target)"
        case .unreadable(let reason):
            "the provisioning profile could not be read: \(reason)"
        }
    }
}

/// The part of a provisioning profile's property list that is read: its entitlements.
private struct ProfileContents: Decodable {
    struct Entitlements: Decodable {
        var apsEnvironment: String?
        var macOSAPSEnvironment: String?

        enum CodingKeys: String, CodingKey {
            case apsEnvironment = "aps-environment"
            case macOSAPSEnvironment = "com.apple.developer.aps-environment"
        }
    }

    var entitlements: Entitlements

    enum CodingKeys: String, CodingKey {
        case entitlements = "Entitlements"
    }
}
