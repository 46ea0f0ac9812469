// swift-tools-version:6.0
//
// ForgePushToken: an APNs device-token manager for apps (the `ForgePushToken` library) and the
// `forge-push-token-server` HTTP service that serves one device token, its one owner's, over
// libmicrohttpd.
//
// An app that depends only on the `ForgePushToken` product builds only that target: it needs the
// Swift toolchain and nothing else (no libmicrohttpd).
import PackageDescription

/// The settings every Swift target shares (the Swift 6 language mode is set for the package below):
/// - `ExistentialAny`: an existential is spelled `any P`, so that its cost (boxing, dynamic
///   dispatch) is visible where a store or a subscriber is held as one.
/// - `MemberImportVisibility`: a file uses only members of the modules it imports itself, so the
///   module graph in docs/architecture.md cannot be bypassed through a transitive import.
/// - `InferIsolatedConformances` is left out: nothing here is isolated to an actor but the
///   platform adapters, whose conformances are spelled out.
let swiftSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "ForgePushToken",
    platforms: [.iOS(.v15), .macOS(.v12), .tvOS(.v15), .watchOS(.v8), .visionOS(.v1)],
    products: [
        .library(name: "ForgePushToken", targets: ["ForgePushToken"]),
        .executable(name: "forge-push-token-server", targets: ["forge-push-token-server"]),
    ],
    targets: [
        // The library: PushTokenManager, hex encoding, platform registration adapters.
        .target(
            name: "ForgePushToken", resources: [.copy("Resources/PrivacyInfo.xcprivacy")],
            swiftSettings: swiftSettings),

        // libmicrohttpd as a system library (Debian: libmicrohttpd-dev), with a shim header that
        // wraps its variadic entry points in fixed-argument inline functions Swift can call.
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"]), .brew(["libmicrohttpd"])]
        ),

        // The one owner of the service's versioned token and its subscribers, and the seam where
        // the state is kept (TokenStore: memory, the state file). Neither HTTP nor C.
        // The owner is generic over the HTTP layer's rendition and subscribers: its few hot members
        // (current, version, commit, deliver) and Locked.withLock are @inlinable, so the HTTP
        // layer specialises them in every build, with no unsafe flag (docs/performance.md).
        .target(name: "ForgePushTokenOwner", dependencies: ["ForgePushToken"], swiftSettings: swiftSettings),

        // Linux's epoll(7) and eventfd(2) headers, which Swift's Glibc module leaves out (used by
        // the daemon loops and the subscriber watcher; no library is linked).
        .systemLibrary(name: "CLinuxEvents"),

        // hiredis as a system library (Debian: libhiredis-dev 0.14), with a shim header for the
        // parts Swift cannot reach directly (the context's errstr array, reply elements).
        .systemLibrary(
            name: "CHiredis",
            // No pkgConfig: hiredis.pc adds -D_FILE_OFFSET_BITS=64, which SwiftPM refuses with a
            // warning (and which changes nothing on 64-bit Linux); the shim includes
            // <hiredis/hiredis.h> from the default include path instead.
            providers: [.apt(["libhiredis-dev"]), .brew(["hiredis"])]
        ),

        // GnuTLS as a system library (Debian: libgnutls28-dev; the runtime image carries
        // libgnutls30 for libmicrohttpd already), with a shim header that names what Swift cannot
        // reach directly (a function-like macro).
        .systemLibrary(
            name: "CGnuTLS",
            pkgConfig: "gnutls",
            providers: [.apt(["libgnutls28-dev"]), .brew(["gnutls"])]
        ),

        // The only module that imports CGnuTLS: a TLS client session over a socket the caller
        // owns, with the certificate always verified (TLS to Redis, docs/replicas.md).
        .target(name: "GnuTLSClient", dependencies: ["CGnuTLS"], swiftSettings: swiftSettings),

        // The Prometheus text exposition format and the one histogram type, for the service's series
        // (ForgePushTokenHTTP) and the Redis store's (RedisTokenStore). Its own small module because
        // no existing one fits: the only modules both import are ForgePushToken (the app library)
        // and ForgePushTokenOwner, which knows no HTTP and no Prometheus (docs/architecture.md).
        // Pure Swift, no dependency.
        .target(name: "PrometheusExposition", swiftSettings: swiftSettings),

        // The level of the service's log lines (ServerLogLevel), apart from the app library's
        // PushTokenManager.LogLevel. Its own small module because the modules that log for the
        // service (ForgePushTokenHTTP, MicroHTTPDServer, RedisTokenStore, the executable) share no
        // other one that fits: the engine does not import the owner, the Redis store not the HTTP
        // layer, and ForgePushToken is the app library. Pure Swift, no dependency.
        .target(name: "ServiceLogging", swiftSettings: swiftSettings),

        // The only module that imports CHiredis: the Redis connection, URL, Lua scripts and the
        // store that lets replicas share one token (docs/replicas.md).
        .target(
            name: "RedisTokenStore",
            dependencies: [
                "CHiredis", "GnuTLSClient", "ForgePushToken", "ForgePushTokenOwner", "PrometheusExposition",
                "ServiceLogging",
            ],
            swiftSettings: swiftSettings),

        // Pure Swift HTTP semantics: requests, responses, routes, body decoding, SSE framing.
        .target(
            name: "ForgePushTokenHTTP",
            dependencies: [
                "ForgePushToken", "ForgePushTokenOwner", "PrometheusExposition",
                "ServiceLogging",
            ],
            swiftSettings: swiftSettings),

        // The only module that imports CMicroHTTPD: daemon, callbacks, streaming, shutdown. The
        // engine: generic over ForgePushTokenHTTP's `HTTPApplication`, it knows nothing of the
        // owner (it does not import ForgePushTokenOwner; docs/architecture.md, "Replacing the engine").
        .target(
            name: "MicroHTTPDServer",
            dependencies: ["CMicroHTTPD", "CLinuxEvents", "ForgePushTokenHTTP", "ForgePushToken", "ServiceLogging"],
            swiftSettings: swiftSettings),

        // Configuration, signals, start and stop.
        .executableTarget(
            name: "forge-push-token-server",
            dependencies: [
                "MicroHTTPDServer", "ForgePushTokenHTTP", "ForgePushTokenOwner", "ForgePushToken", "RedisTokenStore",
                "ServiceLogging", "CLinuxEvents",
            ]
        ),

        // Helpers the test targets share (log recorder, threads, waiting on a condition).
        .target(
            name: "ForgePushTokenTestSupport", dependencies: ["ForgePushToken"], path: "Tests/TestSupport",
            swiftSettings: swiftSettings),
        // The owner's testing kit: a scripted store on MemoryTokenStore's decisions, a recording
        // subscriber, and waiting for a commit's outcome (commitAtOnce, commitAndWait).
        .target(
            name: "ForgePushTokenOwnerTestSupport", dependencies: ["ForgePushTokenOwner", "ForgePushToken"],
            path: "Tests/OwnerTestSupport", swiftSettings: swiftSettings),
        // Fixtures/ holds provisioning profiles (scripts/make-profile-fixtures.sh); the tests read
        // them beside their source file (#filePath), so they are not bundled as resources.
        .testTarget(
            name: "ForgePushTokenTests", dependencies: ["ForgePushToken", "ForgePushTokenTestSupport"],
            exclude: ["Fixtures"], swiftSettings: swiftSettings),
        .testTarget(
            name: "ForgePushTokenOwnerTests",
            dependencies: [
                "ForgePushTokenOwner", "ForgePushToken", "ForgePushTokenTestSupport", "ForgePushTokenOwnerTestSupport",
            ],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "ForgePushTokenHTTPTests",
            dependencies: [
                "ForgePushTokenHTTP", "ForgePushTokenOwner", "ForgePushToken", "ForgePushTokenTestSupport",
                "ForgePushTokenOwnerTestSupport", "ServiceLogging", "PrometheusExposition",
            ],
            swiftSettings: swiftSettings),
        // The engine's own tests: against a small fake application, with no owner.
        .testTarget(
            name: "MicroHTTPDServerTests",
            dependencies: [
                "MicroHTTPDServer", "ForgePushTokenHTTP", "ForgePushToken", "ForgePushTokenTestSupport",
                "ServiceLogging",
            ],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "RedisTokenStoreTests",
            dependencies: [
                "RedisTokenStore", "ForgePushTokenOwner", "ForgePushToken", "ForgePushTokenTestSupport",
                "PrometheusExposition", "ServiceLogging",
            ],
            swiftSettings: swiftSettings),
        // The executable's options, and the whole service behind the engine over real sockets
        // (LiveServer: the executable's wiring on a free port).
        .testTarget(
            name: "ForgePushTokenServerTests",
            dependencies: [
                "forge-push-token-server", "MicroHTTPDServer", "ForgePushTokenHTTP", "RedisTokenStore",
                "ForgePushToken", "ForgePushTokenOwner", "ForgePushTokenTestSupport", "ForgePushTokenOwnerTestSupport",
                "ServiceLogging",
            ], swiftSettings: swiftSettings),
    ],
    swiftLanguageModes: [.v6]
)

// The server and its tests need Linux (epoll, eventfd, Glibc; docs/operations.md). On Apple
// platforms the package is the library alone: `swift test` on a Mac builds and runs the library's
// tests (.github/workflows/library.yml), and an app's Xcode never sees the server's targets.
#if !os(Linux)
    let libraryTargets: Set<String> = ["ForgePushToken", "ForgePushTokenTestSupport", "ForgePushTokenTests"]
    package.targets = package.targets.filter { libraryTargets.contains($0.name) }
    package.products = package.products.filter { $0.name == "ForgePushToken" }
#endif
