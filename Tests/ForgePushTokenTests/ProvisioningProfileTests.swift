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

    @Test func aProcessWithoutAProfileIsProduction() throws {
        // The test runner has no embedded profile (on Linux there is no bundle lookup at all).
        #expect(try APNsEnvironment.current() == .production)
    }

    @Test func rawValuesAreTheEntitlementValues() {
        #expect(APNsEnvironment.development.rawValue == "development")
        #expect(APNsEnvironment.production.rawValue == "production")
        #expect(APNsEnvironment.allCases == [.development, .production])
    }
}
