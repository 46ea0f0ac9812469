#!/usr/bin/env bash
# Type-checks the UIKit, AppKit and WatchKit branches of the ForgePushToken library on Linux,
# where no Apple SDK exists, against the stand-in modules in Tests/PlatformStandIns/ (which
# declare only the members the library calls, with Apple's signatures, isolation and
# availability). For each branch, in a folder where only that stand-in can be imported:
#   1. the stand-in is compiled into a module named UIKit, AppKit or WatchKit;
#   2. every file of Sources/ForgePushToken is compiled into a module against it, in the Swift 6
#      language mode with warnings as errors;
#   3. a client calling `registerForRemoteNotifications()` from the main actor must compile (so
#      the branch was taken and the method is public);
#   4. the same call from a nonisolated function must be refused as main-actor isolated.
# Stand-ins prove signatures and isolation, not availability: platform attributes are not
# evaluated when compiling for Linux (see the comment in RemoteNotificationRegistration.swift).
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
common=(-swift-version 6 -warnings-as-errors -parse-as-library)
sources=(Sources/ForgePushToken/*.swift)

for branch in UIKit AppKit WatchKit; do
  dir="$work/$branch"
  mkdir -p "$dir"
  swiftc "${common[@]}" -emit-module -module-name "$branch" \
    -emit-module-path "$dir/$branch.swiftmodule" "Tests/PlatformStandIns/$branch.swift"
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
  echo "check-platform-branches: $branch branch type-checks; registerForRemoteNotifications() needs the main actor"
done
