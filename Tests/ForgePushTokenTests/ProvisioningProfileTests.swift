import Foundation
import Testing

@testable import ForgePushToken

/// `APNsEnvironment` from provisioning profiles: the fixtures in Fixtures/ are CMS-signed
/// property lists made by scripts/make-profile-fixtures.sh the way Apple's profiles are shaped.
@Suite("APNs environment from the provisioning profile")
struct ProvisioningProfileTests {
    /// The bytes of the fixture `name`, read beside this source file.
    func fixture(_ name: String) throws -> Data {
        let folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures")
        return try Data(contentsOf: folder.appendingPathComponent(name))
    }

    @Test func aDevelopmentProfileNamesTheSandbox() throws {
        let profile = try fixture("development.mobileprovision")
        #expect(try APNsEnvironment.entitlement(inProvisioningProfile: profile) == .development)
        #expect(try APNsEnvironment.decide(provisioningProfile: profile, isSimulator: false) == .development)
    }

    @Test func aProductionProfileNamesProduction() throws {
        let profile = try fixture("production.mobileprovision")
        #expect(try APNsEnvironment.entitlement(inProvisioningProfile: profile) == .production)
        #expect(try APNsEnvironment.decide(provisioningProfile: profile, isSimulator: false) == .production)
    }

    @Test func theMacOSKeyIsRead() throws {
        let profile = try fixture("macos-development.provisionprofile")
        #expect(try APNsEnvironment.entitlement(inProvisioningProfile: profile) == .development)
    }

    @Test func aProfileWithoutTheEntitlement() throws {
        let profile = try fixture("no-entitlement.mobileprovision")
        #expect(try APNsEnvironment.entitlement(inProvisioningProfile: profile) == nil)
        #expect(throws: ProvisioningProfileError.noEntitlement) {
            try APNsEnvironment.decide(provisioningProfile: profile, isSimulator: false)
        }
        #expect(ProvisioningProfileError.noEntitlement.description.contains("Push Notifications capability"))
    }

    @Test func aTruncatedProfileIsAClearError() throws {
        // The development profile cut before its </plist>: it contains "development", but no
        // complete property list.
        let profile = try fixture("truncated.mobileprovision")
        #expect(profile.firstRange(of: Data("<string>development</string>".utf8)) != nil)
        #expect(throws: ProvisioningProfileError.noPropertyList) {
            try APNsEnvironment.entitlement(inProvisioningProfile: profile)
        }
    }

    @Test func garbageIsAClearError() throws {
        #expect(throws: ProvisioningProfileError.noPropertyList) {
            try APNsEnvironment.entitlement(inProvisioningProfile: try fixture("garbage.mobileprovision"))
        }
        #expect(throws: ProvisioningProfileError.noPropertyList) {
            try APNsEnvironment.entitlement(inProvisioningProfile: Data())
        }
    }

    @Test func aPropertyListThatIsNotAProfile() throws {
        let plist = Data(
            """
            junk<?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict><key>Name</key><string>x</string></dict></plist>junk
            """.utf8)
        #expect {
            try APNsEnvironment.entitlement(inProvisioningProfile: plist)
        } throws: { error in
            guard case .notAProfile = error as? ProvisioningProfileError else { return false }
            return true
        }
    }

    @Test func anUnknownEnvironmentIsAClearError() throws {
        let plist = Data(
            """
            <?xml version="1.0" encoding="UTF-8"?>
            <plist version="1.0"><dict><key>Entitlements</key><dict>
            <key>aps-environment</key><string>staging</string></dict></dict></plist>
            """.utf8)
        #expect(throws: ProvisioningProfileError.unknownEnvironment("staging")) {
            try APNsEnvironment.entitlement(inProvisioningProfile: plist)
        }
    }

    @Test func onlyTheFirstPropertyListIsRead() throws {
        // Everything after the first </plist> (the CMS signature, in a real profile) is ignored.
        let first = try fixture("production.mobileprovision")
        let second = try fixture("development.mobileprovision")
        #expect(try APNsEnvironment.entitlement(inProvisioningProfile: first + second) == .production)
    }

    @Test func theSimulatorIsDevelopmentAndNoProfileIsProduction() throws {
        let production = try fixture("production.mobileprovision")
        #expect(try APNsEnvironment.decide(provisioningProfile: production, isSimulator: true) == .development)
        #expect(try APNsEnvironment.decide(provisioningProfile: nil, isSimulator: true) == .development)
        #expect(try APNsEnvironment.decide(provisioningProfile: nil, isSimulator: false) == .production)
        // The simulator does not even read a broken profile.
        #expect(try APNsEnvironment.decide(provisioningProfile: Data([1, 2, 3]), isSimulator: true) == .development)
    }

    /// A fixture app bundle folder in a new temporary folder, with `profile` (a fixture's name)
    /// copied to `location` in it, or no profile; removed by `body`'s end.
    @discardableResult
    func withAppBundle<R>(
        profile: String?, at location: APNsEnvironment.ProfileLocation, _ body: (URL) throws -> R
    ) throws -> R {
        let root = FileManager.default.temporaryDirectory.appendingPathComponent("fpt-bundle-\(UUID().uuidString)")
        defer { try? FileManager.default.removeItem(at: root) }
        let bundle = root.appendingPathComponent("Fixture.app")
        try FileManager.default.createDirectory(at: bundle, withIntermediateDirectories: true)
        if let profile {
            let target = location.url(in: bundle)
            try FileManager.default.createDirectory(
                at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
            try fixture(profile).write(to: target)
        }
        return try body(bundle)
    }

    @Test func theLookupReadsTheProfileAtEachPlatformsPlaceInTheBundle() throws {
        try withAppBundle(profile: "development.mobileprovision", at: .rootMobileProvision) { (bundle: URL) throws in
            #expect(
                try APNsEnvironment.current(appBundle: bundle, location: .rootMobileProvision, isSimulator: false)
                    == .development)
            // The macOS place is empty in an iOS-shaped bundle: no profile, production.
            #expect(
                try APNsEnvironment.current(appBundle: bundle, location: .contentsProvisionProfile, isSimulator: false)
                    == .production)
        }
        try withAppBundle(profile: "macos-development.provisionprofile", at: .contentsProvisionProfile) {
            (bundle: URL) throws in
            #expect(
                try APNsEnvironment.current(appBundle: bundle, location: .contentsProvisionProfile, isSimulator: false)
                    == .development)
        }
        try withAppBundle(profile: "production.mobileprovision", at: .rootMobileProvision) { (bundle: URL) throws in
            #expect(
                try APNsEnvironment.current(appBundle: bundle, location: .rootMobileProvision, isSimulator: false)
                    == .production)
            // In the simulator the profile is not even read.
            #expect(
                try APNsEnvironment.current(appBundle: bundle, location: .rootMobileProvision, isSimulator: true)
                    == .development)
        }
    }

    @Test func aBundleWithoutAProfileIsProductionAndBrokenOnesAreClearErrors() throws {
        try withAppBundle(profile: nil, at: .rootMobileProvision) { (bundle: URL) throws in
            #expect(
                try APNsEnvironment.current(appBundle: bundle, location: .rootMobileProvision, isSimulator: false)
                    == .production)
            // A folder where the profile should be: it exists but cannot be read.
            try FileManager.default.createDirectory(
                at: bundle.appendingPathComponent("embedded.mobileprovision"), withIntermediateDirectories: false)
            // (`#expect(throws:)` returns the error only from Swift 6.1; do/catch builds with 6.0.)
            do {
                let environment = try APNsEnvironment.current(
                    appBundle: bundle, location: .rootMobileProvision, isSimulator: false)
                Issue.record("expected .unreadable, got \(environment)")
            } catch {
                guard case .unreadable = error as? ProvisioningProfileError else {
                    Issue.record("expected .unreadable, got \(error)")
                    return
                }
            }
        }
        try withAppBundle(profile: "no-entitlement.mobileprovision", at: .rootMobileProvision) { (bundle: URL) throws in
            #expect(throws: ProvisioningProfileError.noEntitlement) {
                try APNsEnvironment.current(appBundle: bundle, location: .rootMobileProvision, isSimulator: false)
            }
        }
        try withAppBundle(profile: "garbage.mobileprovision", at: .rootMobileProvision) { (bundle: URL) throws in
            #expect(throws: ProvisioningProfileError.noPropertyList) {
                try APNsEnvironment.current(appBundle: bundle, location: .rootMobileProvision, isSimulator: false)
            }
        }
    }

    @Test func withoutAnAppBundleOrAPlaceForAProfileItIsProduction() throws {
        // Linux: no bundle and no platform location; current() takes that path here.
        #expect(
            try APNsEnvironment.current(appBundle: nil, location: .rootMobileProvision, isSimulator: false)
                == .production)
        #expect(
            try APNsEnvironment.current(
                appBundle: URL(fileURLWithPath: "/nonexistent"), location: nil, isSimulator: false) == .production)
        #if os(Linux)
            #expect(APNsEnvironment.ProfileLocation.platform == nil)
            #expect(try APNsEnvironment.current() == .production)
        #endif
    }

    @Test func rawValuesAreTheEntitlementValues() {
        #expect(APNsEnvironment.development.rawValue == "development")
        #expect(APNsEnvironment.production.rawValue == "production")
        #expect(APNsEnvironment.allCases == [.development, .production])
    }
}
