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

        // What the server's modules share and an app never needs (the app library stays free of
        // it): the per-thread locks (`PerThreadLocked`), the engine's wake batching (`WakeBatch`),
        // the server's one clock (`ServerClock`), the one server log value (`ServerLog`, its level
        // and its JSON lines), the Prometheus
        // text format, the JSON body encoder and string escaper, time helpers (`Duration`
        // conversions, `httpDate`), `writeAll` and the system error text. swift-system's and
        // swift-log's role; pure Swift over ForgePushToken (for `Locked`).
        .target(name: "ServerSupport", dependencies: ["ForgePushToken"], swiftSettings: swiftSettings),

        // The one owner of the service's versioned token and its subscribers, and the seam where
        // the state is kept (TokenStore: memory, the state file). Neither HTTP nor C.
        // The owner is generic over the HTTP layer's rendition and subscribers: its few hot members
        // (current, version, commit, deliver) and Locked.withLock are @inlinable, so the HTTP
        // layer specialises them in every build, with no unsafe flag (docs/performance.md).
        .target(
            name: "ForgePushTokenOwner", dependencies: ["ForgePushToken", "ServerSupport"],
            swiftSettings: swiftSettings),

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

        // The only module that imports CHiredis: the Redis connection, URL, Lua scripts and the
        // store that lets replicas share one token (docs/replicas.md).
        .target(
            name: "RedisTokenStore",
            dependencies: ["CHiredis", "GnuTLSClient", "ForgePushToken", "ForgePushTokenOwner", "ServerSupport"],
            swiftSettings: swiftSettings),

        // The contract between an engine and an application (HummingbirdCore's role), pure Swift:
        // the request and response vocabulary, pending responses, the engine's own answers,
        // framing, the head budget and deadlines, the response header fields, CORS, entity tags,
        // SSE framing, and the narrow `HTTPApplication`. It names no route and no owner.
        .target(
            name: "HTTPServing", dependencies: ["ForgePushToken", "ServerSupport"], swiftSettings: swiftSettings),

        // The token service as an `HTTPApplication` (hummingbird's Application and Router): the
        // routes, `Service`, the responder split by job, metrics, snapshots, subscribers, the
        // replica mode, drain and credentials, over the owner.
        .target(
            name: "TokenService",
            dependencies: ["HTTPServing", "ServerSupport", "ForgePushToken", "ForgePushTokenOwner"],
            swiftSettings: swiftSettings),

        // The only module that imports CMicroHTTPD: daemon, callbacks, streaming, shutdown. The
        // engine: generic over HTTPServing's `HTTPApplication`, it knows no route and no owner (it
        // imports neither TokenService nor ForgePushTokenOwner; docs/architecture.md, "Replacing
        // the engine"; scripts/check-module-graph.py checks its imports).
        .target(
            name: "MicroHTTPDServer",
            dependencies: ["CMicroHTTPD", "CLinuxEvents", "HTTPServing", "ServerSupport", "ForgePushToken"],
            swiftSettings: swiftSettings),

        // Configuration, signals, start and stop.
        .executableTarget(
            name: "forge-push-token-server",
            dependencies: [
                "MicroHTTPDServer", "TokenService", "HTTPServing", "ForgePushTokenOwner", "ForgePushToken",
                "RedisTokenStore", "GnuTLSClient", "ServerSupport", "CLinuxEvents",
            ]
        ),

        // Helpers the test targets share (log recorder, threads, waiting on a condition).
        .target(
            name: "ForgePushTokenTestSupport", dependencies: ["ForgePushToken"], path: "Tests/TestSupport",
            swiftSettings: swiftSettings),
        // The owner's testing kit: a scripted store on MemoryTokenStore's decisions, a recording
        // subscriber, and waiting for a commit's outcome (commitAtOnce, commitAndWait).
        .target(
            name: "ForgePushTokenOwnerTestSupport",
            dependencies: ["ForgePushTokenOwner", "ForgePushToken", "ServerSupport"],
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
        // The token service's tests (and the server support's: the wake batch, the log lines).
        .testTarget(
            name: "TokenServiceTests",
            dependencies: [
                "TokenService", "HTTPServing", "ServerSupport", "ForgePushTokenOwner", "ForgePushToken",
                "ForgePushTokenTestSupport", "ForgePushTokenOwnerTestSupport",
            ],
            swiftSettings: swiftSettings),
        // The engine's own tests: against a small fake application with routes of its own, with
        // no owner and no token service.
        .testTarget(
            name: "MicroHTTPDServerTests",
            dependencies: [
                "MicroHTTPDServer", "HTTPServing", "ServerSupport", "ForgePushToken", "ForgePushTokenTestSupport",
            ],
            swiftSettings: swiftSettings),
        .testTarget(
            name: "RedisTokenStoreTests",
            dependencies: [
                "RedisTokenStore", "ForgePushTokenOwner", "ForgePushToken", "ForgePushTokenTestSupport",
                "ServerSupport",
            ],
            swiftSettings: swiftSettings),
        // The executable's options, and the whole service behind the engine over real sockets
        // (LiveServer: the executable's wiring on a free port).
        .testTarget(
            name: "ForgePushTokenServerTests",
            dependencies: [
                "forge-push-token-server", "MicroHTTPDServer", "TokenService", "HTTPServing", "RedisTokenStore",
                "ForgePushToken", "ForgePushTokenOwner", "ForgePushTokenTestSupport", "ForgePushTokenOwnerTestSupport",
                "ServerSupport",
            ], swiftSettings: swiftSettings),
    ],
    swiftLanguageModes: [.v6]
)

// The request fuzzer (fuzz/README.md): the harness in fuzz/Harness as an executable target over the
// pure-Swift token service, so that it is built by SwiftPM with the package's own settings. fuzz/run.sh
// builds it with libFuzzer and AddressSanitizer in a scratch path of its own (`swift build --product
// request-fuzzer -Xswiftc -sanitize=fuzzer,address -Xswiftc -D -Xswiftc FORGE_REQUEST_FUZZER`), with
// no unsafe flag here: every other build (`swift build`, the sanitizer builds of scripts/test.sh)
// compiles it as a plain program that runs the input files it is given once each. Linux only: it
// is filtered out below with the server.
package.targets.append(
    .executableTarget(
        name: "RequestFuzzer",
        dependencies: ["TokenService", "HTTPServing", "ServerSupport", "ForgePushTokenOwner", "ForgePushToken"],
        path: "fuzz/Harness", swiftSettings: swiftSettings))
package.products.append(.executable(name: "request-fuzzer", targets: ["RequestFuzzer"]))

// The server and its tests need Linux (epoll, eventfd, Glibc; docs/operations.md). On Apple
// platforms the package is the library alone: `swift test` on a Mac builds and runs the library's
// tests (.github/workflows/library.yml), and an app's Xcode never sees the server's targets.
#if !os(Linux)
    let libraryTargets: Set<String> = ["ForgePushToken", "ForgePushTokenTestSupport", "ForgePushTokenTests"]
    package.targets = package.targets.filter { libraryTargets.contains($0.name) }
    package.products = package.products.filter { $0.name == "ForgePushToken" }
#endif
