#!/usr/bin/env bash
# Type-checks the UIKit, AppKit and WatchKit branches of the ForgePushToken library on Linux
# where no Apple SDK exists, against the stand-in modules in Tests/PlatformStandIns/ (which
# declare only the members the library calls, with Apple's signatures, isolation and
# availability). For each branch, in a folder where only that stand-in can be imported:
#   1. the stand-in is compiled into a module named UIKit, AppKit or WatchKit;
#   2. every file of Sources/ForgePushToken is compiled into a module against it, in the Swift 6
#      language mode with warnings as errors;
#   3. a client calling `registerForRemoteNotifications()` from the main actor must compile (so
#      the branch was taken and the method is public);
#   4. the same call from a nonisolated function must be refused as main-actor isolated;
#   5. a @MainActor model with a non-Sendable, main-actor API client must compile calling
#      uploadTokenChanges (the upload runs in the caller's isolation) and APNsEnvironment.current();
#   6. without the stand-in's `Bundle` the library must not compile, so the branch's provisioning
#      profile lookup (APNsEnvironment.swift) was compiled against Apple's `Bundle` signatures;
#   7. (UIKit) without the stand-in's `beginBackgroundTask`/`endBackgroundTask` the library must not
#      compile, so each upload attempt's background task assertion (BackgroundTime.swift) was
#      compiled against Apple's signatures and isolation;
#   8. beside it, the UserNotifications stand-in (Tests/PlatformStandIns/UserNotifications.swift) is
#      compiled too, and without its `notificationSettings()` the library must not compile, so the
#      authorization status (NotificationAuthorization.swift) was read through Apple's signatures.
# Then, once: the Apple-only `UserDefaultsServerRecordStore` and its marker file's exclusion from
# backups (ServerRecord.swift, between its BEGIN and END lines, compiled only where Darwin exists) are
# type-checked with the library against Foundation's `UserDefaults`, `FileManager` and
# `URLResourceValues.isExcludedFromBackup` (swift-corelibs-foundation declares Apple's signatures),
# Swift 6, warnings as errors.
# Stand-ins prove signatures and isolation, not availability: platform attributes are not
# evaluated when compiling for Linux (see the comment in RemoteNotificationRegistration.swift).
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(-swift-version 6 -warnings-as-errors -parse-as-library)
sources=(Sources/ForgePushToken/*.swift)

# must_not_compile MODULES EXPECTED WHY WITHOUT: the library, type-checked against the stand-in
# modules in MODULES (one of them with a member removed), must fail, and with EXPECTED among its
# errors: a branch that compiles without that member does not use it (WHY), and one that fails
# for another reason is shown with its errors (WITHOUT: what was removed).
must_not_compile() {
  local modules="$1" expected="$2" why="$3" without="$4" log="$1.txt"
  if swiftc "${common[@]}" -typecheck -module-name ForgePushToken -package-name ForgePushToken \
    -I "$modules" "${sources[@]}" >"$log" 2>&1; then
    echo "check-platform-branches: $why" >&2
    exit 1
  fi
  if ! grep -q "$expected" "$log"; then
    echo "check-platform-branches: $without the library failed for another reason:" >&2
    cat "$log" >&2
    exit 1
  fi
}

for branch in UIKit AppKit WatchKit; do
  dir="$work/$branch"
  mkdir -p "$dir"
  swiftc "${common[@]}" -emit-module -module-name "$branch" \
    -emit-module-path "$dir/$branch.swiftmodule" "Tests/PlatformStandIns/$branch.swift"
  swiftc "${common[@]}" -emit-module -module-name UserNotifications \
    -emit-module-path "$dir/UserNotifications.swiftmodule" Tests/PlatformStandIns/UserNotifications.swift
  swiftc "${common[@]}" -emit-module -module-name ForgePushToken -package-name ForgePushToken -I "$dir" \
    -emit-module-path "$dir/ForgePushToken.swiftmodule" "${sources[@]}"

  cat > "$dir/main_actor_client.swift" <<'SWIFT'
import ForgePushToken
@MainActor func start(_ manager: PushTokenManager) {
    manager.registerForRemoteNotifications()
}
SWIFT
  swiftc "${common[@]}" -typecheck -I "$dir" "$dir/main_actor_client.swift"

  cat > "$dir/nonisolated_client.swift" <<'SWIFT'
import ForgePushToken
func start(_ manager: PushTokenManager) {
    manager.registerForRemoteNotifications()
}
SWIFT
  if swiftc "${common[@]}" -typecheck -I "$dir" "$dir/nonisolated_client.swift" >"$dir/refused.txt" 2>&1; then
    echo "check-platform-branches: $branch: a nonisolated call compiled; it must need the main actor" >&2
    exit 1
  fi
  if ! grep -q "main actor-isolated" "$dir/refused.txt"; then
    echo "check-platform-branches: $branch: the nonisolated call failed for another reason:" >&2
    cat "$dir/refused.txt" >&2
    exit 1
  fi

  cat > "$dir/main_actor_model.swift" <<'SWIFT'
import ForgePushToken

/// An app's API client: main-actor state, not Sendable.
@MainActor final class APIClient {
    var devices: [String: APNsEnvironment] = [:]
    func register(_ token: String, environment: APNsEnvironment) async throws {
        devices[token] = environment
    }
}

@MainActor final class PushModel {
    let client = APIClient()
    var lastUpload: PushTokenManager.TokenUpload?
    var decided: APNsEnvironment?

    func keepServerInStep(_ pushTokens: PushTokenManager) async {
        decided = try? APNsEnvironment.current()
        if #available(iOS 16, macOS 13, tvOS 16, watchOS 9, *) {
            await pushTokens.uploadTokenChanges { upload in
                lastUpload = upload
                if let token = upload.token {
                    try await client.register(token, environment: upload.environment)
                }
                return .done
            }
        }
    }
}
SWIFT
  swiftc "${common[@]}" -typecheck -I "$dir" "$dir/main_actor_model.swift"

  sed '/^\/\/ BEGIN Bundle$/,/^\/\/ END Bundle$/d' "Tests/PlatformStandIns/$branch.swift" > "$dir/without-bundle.swift"
  mkdir -p "$dir/without-bundle"
  swiftc "${common[@]}" -emit-module -module-name "$branch" \
    -emit-module-path "$dir/without-bundle/$branch.swiftmodule" "$dir/without-bundle.swift"
  must_not_compile "$dir/without-bundle" "cannot find 'Bundle' in scope" \
    "$branch: the library compiled without Bundle; the branch must read the profile" "$branch: without Bundle"
  background=""
  if [ "$branch" = UIKit ]; then
    sed '/^    \/\/ BEGIN Background$/,/^    \/\/ END Background$/d' "Tests/PlatformStandIns/$branch.swift" > "$dir/without-background.swift"
    mkdir -p "$dir/without-background"
    swiftc "${common[@]}" -emit-module -module-name "$branch" \
      -emit-module-path "$dir/without-background/$branch.swiftmodule" "$dir/without-background.swift"
    must_not_compile "$dir/without-background" "has no member 'beginBackgroundTask'" \
      "UIKit: the library compiled without beginBackgroundTask; uploads must take a background task assertion" \
      "UIKit: without beginBackgroundTask"
    background="; each upload attempt takes a background task assertion"
  fi
  # Without notificationSettings() the library must not compile: the authorization is read.
  mkdir -p "$dir/without-settings"
  cp "$dir/$branch.swiftmodule" "$dir/without-settings/"
  grep -v 'open func notificationSettings()' Tests/PlatformStandIns/UserNotifications.swift >"$dir/without-settings.swift"
  swiftc "${common[@]}" -emit-module -module-name UserNotifications \
    -emit-module-path "$dir/without-settings/UserNotifications.swiftmodule" "$dir/without-settings.swift"
  must_not_compile "$dir/without-settings" "has no member 'notificationSettings'" \
    "$branch: the library compiled without notificationSettings(); uploads must read the authorization" \
    "$branch: without notificationSettings()"
  echo "check-platform-branches: $branch branch type-checks; registerForRemoteNotifications() needs the main actor;" \
    "a @MainActor model compiles against uploadTokenChanges; the branch reads the profile through Bundle$background;" \
    "the authorization status is read through UserNotifications"
done

store="$work/UserDefaultsStore.swift"
{
  echo 'import Foundation'
  sed -n '/^[[:space:]]*\/\/ BEGIN UserDefaults store$/,/^[[:space:]]*\/\/ END UserDefaults store$/p' Sources/ForgePushToken/ServerRecord.swift
} >"$store"
if ! grep -q 'public struct UserDefaultsServerRecordStore' "$store" || ! grep -q 'isExcludedFromBackup = true' "$store"; then
  echo "check-platform-branches: no UserDefaults store between BEGIN and END in ServerRecord.swift" >&2
  exit 1
fi
swiftc "${common[@]}" -typecheck -module-name ForgePushToken -package-name ForgePushToken "${sources[@]}" "$store"
echo "check-platform-branches: the Apple-only UserDefaults store and its backup-excluded marker type-check with the library against Foundation"
