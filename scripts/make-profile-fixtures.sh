#!/usr/bin/env bash
# Writes the provisioning-profile fixtures of Tests/ForgePushTokenTests/Fixtures/, which the tests
# of APNsEnvironment parse on Linux (ProvisioningProfileTests.swift).
#
# A provisioning profile (embedded.mobileprovision in an iOS, tvOS, watchOS or visionOS app;
# Contents/embedded.provisionprofile in a macOS app) is a CMS SignedData message, DER-encoded,
# whose content is an XML property list. `openssl cms -sign -nodetach -binary -outform DER`
# makes the same shape: the property list embedded once, byte for byte, in definite-length DER.
# (`-stream` would chunk it into indefinite-length octet strings; without `-binary` the text
# would be CRLF-converted; other output forms are S/MIME or base64.) The signature is made with
# a throwaway key and certificate in a temporary folder, deleted on exit: no key is committed,
# and nothing checks the signature (the library reads the entitlement, it does not verify it).
#
# Usage: scripts/make-profile-fixtures.sh   (rewrites every fixture; the garbage one is random)
set -euo pipefail
cd "$(dirname "$0")/.."
out=Tests/ForgePushTokenTests/Fixtures
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=ForgePushToken fixture signer" \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
# The throwaway certificate, as a real profile lists its developer certificates (base64 DER).
certificate="$(openssl x509 -in "$work/cert.pem" -outform DER | base64 -w 0)"

# plist NAME PLATFORM ENTITLEMENTS-XML: a property list shaped like one Xcode downloads.
plist() {
  local name="$1" platform="$2" entitlements="$3"
  cat > "$work/$name.plist" <<PLIST
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>AppIDName</key>
	<string>Forge Push Example</string>
	<key>ApplicationIdentifierPrefix</key>
	<array>
	<string>ABCDE12345</string>
	</array>
	<key>CreationDate</key>
	<date>2026-01-05T10:00:00Z</date>
	<key>Platform</key>
	<array>
		<string>$platform</string>
	</array>
	<key>IsXcodeManaged</key>
	<true/>
	<key>DeveloperCertificates</key>
	<array>
		<data>$certificate</data>
	</array>
	<key>DER-Encoded-Profile</key>
	<data>MIINiAYJKoZIhvcNAQcCoIINeTCCDXUCAQExCzAJBgUrDgMCGgUA</data>
	<key>Entitlements</key>
	<dict>
$entitlements
	</dict>
	<key>ExpirationDate</key>
	<date>2027-01-05T10:00:00Z</date>
	<key>Name</key>
	<string>$platform Team Provisioning Profile: com.example.forgepush</string>
	<key>ProvisionedDevices</key>
	<array>
		<string>00008110-000A1B2C3D4E5F60</string>
	</array>
	<key>TeamIdentifier</key>
	<array>
		<string>ABCDE12345</string>
	</array>
	<key>TeamName</key>
	<string>Example Team</string>
	<key>TimeToLive</key>
	<integer>365</integer>
	<key>UUID</key>
	<string>6f1e7c52-0d7b-4c1e-9f0e-2f7a1d3b9c44</string>
	<key>Version</key>
	<integer>1</integer>
</dict>
</plist>
PLIST
}

ios_entitlements() {
  cat <<XML
		<key>application-identifier</key>
		<string>ABCDE12345.com.example.forgepush</string>
		<key>keychain-access-groups</key>
		<array>
			<string>ABCDE12345.*</string>
		</array>
		<key>get-task-allow</key>
		<$2/>
		<key>com.apple.developer.team-identifier</key>
		<string>ABCDE12345</string>
$1
XML
}

plist development iOS "$(ios_entitlements '		<key>aps-environment</key>
		<string>development</string>' true)"
plist production iOS "$(ios_entitlements '		<key>aps-environment</key>
		<string>production</string>' false)"
plist no-entitlement iOS "$(ios_entitlements '' true)"
plist macos-development OSX '		<key>com.apple.application-identifier</key>
		<string>ABCDE12345.com.example.forgepush</string>
		<key>com.apple.developer.team-identifier</key>
		<string>ABCDE12345</string>
		<key>com.apple.developer.aps-environment</key>
		<string>development</string>
		<key>keychain-access-groups</key>
		<array>
			<string>ABCDE12345.*</string>
		</array>'

sign() {
  openssl cms -sign -nodetach -binary -outform DER -signer "$work/cert.pem" -inkey "$work/key.pem" \
    -in "$work/$1.plist" -out "$out/$2"
}
sign development development.mobileprovision
sign production production.mobileprovision
sign no-entitlement no-entitlement.mobileprovision
sign macos-development macos-development.provisionprofile

# A download cut short: the development profile up to just before its </plist> (so it still
# holds the entitlement's text, but not a complete property list).
end=$(grep -abo '</plist>' "$out/development.mobileprovision" | head -1 | cut -d: -f1)
head -c "$end" "$out/development.mobileprovision" > "$out/truncated.mobileprovision"
# Not a profile at all.
openssl rand 1024 > "$out/garbage.mobileprovision"
ls -l "$out"
