// swift-tools-version:6.0
//
// ForgePushToken: an APNs device-token manager for apps (the `ForgePushToken` library) and the
// `forge-push-token-server` HTTP service that serves one manager over libmicrohttpd.
//
// An app that depends only on the `ForgePushToken` product builds only that target: it needs the
// Swift toolchain and nothing else (no libmicrohttpd).
import PackageDescription

let package = Package(
    name: "ForgePushToken",
    platforms: [.iOS(.v15), .macOS(.v12), .tvOS(.v15), .watchOS(.v8), .visionOS(.v1)],
    products: [
        .library(name: "ForgePushToken", targets: ["ForgePushToken"]),
        .executable(name: "forge-push-token-server", targets: ["forge-push-token-server"]),
    ],
    targets: [
        // The library: PushTokenManager, hex encoding, platform registration adapters.
        .target(name: "ForgePushToken"),

        // libmicrohttpd as a system library (Debian: libmicrohttpd-dev), with a shim header that
        // wraps its variadic entry points in fixed-argument inline functions Swift can call.
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"]), .brew(["libmicrohttpd"])]
        ),

        // The one owner of the service's versioned token and its subscribers, and the seam where
        // the state is kept (TokenStore: memory, the state file). Neither HTTP nor C.
        .target(name: "ForgePushTokenOwner", dependencies: ["ForgePushToken"]),

        // Linux's epoll(7) and eventfd(2) headers, which Swift's Glibc module leaves out (used by
        // the daemon loops and the subscriber watcher; no library is linked).
        .systemLibrary(name: "CLinuxEvents"),

        // hiredis as a system library (Debian: libhiredis-dev 0.14), with a shim header for the
        // parts Swift cannot reach directly (the context's errstr array, reply elements).
        .systemLibrary(
            name: "CHiredis",
            pkgConfig: "hiredis",
            providers: [.apt(["libhiredis-dev"]), .brew(["hiredis"])]
        ),

        // The only module that imports CHiredis: the Redis connection, URL, Lua scripts and the
        // store that lets replicas share one token (docs/replicas.md).
        .target(name: "RedisTokenStore", dependencies: ["CHiredis", "ForgePushToken", "ForgePushTokenOwner"]),

        // Pure Swift HTTP semantics: requests, responses, routes, body decoding, SSE framing.
        .target(name: "ForgePushTokenHTTP", dependencies: ["ForgePushToken", "ForgePushTokenOwner"]),

        // The only module that imports CMicroHTTPD: daemon, callbacks, streaming, shutdown.
        .target(name: "MicroHTTPDServer", dependencies: ["CMicroHTTPD", "CLinuxEvents", "ForgePushTokenHTTP", "ForgePushTokenOwner"]),

        // Configuration, signals, start and stop.
        .executableTarget(
            name: "forge-push-token-server",
            dependencies: ["MicroHTTPDServer", "ForgePushTokenHTTP", "ForgePushTokenOwner", "ForgePushToken", "RedisTokenStore"]
        ),

        .testTarget(name: "ForgePushTokenTests", dependencies: ["ForgePushToken"]),
        .testTarget(name: "ForgePushTokenOwnerTests", dependencies: ["ForgePushTokenOwner"]),
        .testTarget(name: "ForgePushTokenHTTPTests", dependencies: ["ForgePushTokenHTTP"]),
        .testTarget(name: "MicroHTTPDServerTests", dependencies: ["MicroHTTPDServer", "ForgePushTokenHTTP"]),
        .testTarget(name: "RedisTokenStoreTests", dependencies: ["RedisTokenStore"]),
        .testTarget(name: "ForgePushTokenServerTests", dependencies: ["forge-push-token-server"]),
    ],
    swiftLanguageModes: [.v6]
)
