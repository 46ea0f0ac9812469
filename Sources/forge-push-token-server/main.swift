import CLinuxEvents
import Dispatch
import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import MicroHTTPDServer
import RedisTokenStore
import ServerSupport
import TokenService

// forge-push-token-server: the token's one owner behind HTTP/1.1 (docs/http-api.md, docs/architecture.md).
//
// Start-up: parse the configuration, block SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 (before
// any thread starts, so every thread inherits the mask) and read them from a signalfd(2), start
// the server. Then wait for SIGTERM or SIGINT and shut down gracefully. The process may be PID 1
// in a container, where default signal dispositions do not apply: the signals are handled
// explicitly.
//
// A signalfd, not sigwait(2): while a thread sleeps in sigwait, the kernel unblocks the signals
// it waits for, and /proc shows them unblocked. On a crash the Swift runtime's backtracer pauses
// every other thread with the first of SIGUSR1, SIGUSR2 and SIGPROF that /proc says the thread
// does not block (the swift repository's stdlib/public/runtime/CrashHandlerLinux.cpp,
// `signal_for_suspend`): it sent SIGUSR1 to the thread in sigwait, which took it as an ordinary
// signal and never paused, and the backtracer tried again in 2 s rounds for over 30 s before the
// process died (issue 42). Read from a signalfd, the signals stay blocked in every thread, so the
// backtracer uses SIGPROF, which no thread of the process blocks (libdispatch's workers leave it
// open too), and a crash prints its backtrace and ends the process in about a second.
#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif
#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// First of all, so that a SIGTERM that arrives while the process is still starting is held until
// it is read below (and then shuts down cleanly) instead of killing the process.
var signals = sigset_t()
sigemptyset(&signals)
sigaddset(&signals, SIGTERM)
sigaddset(&signals, SIGINT)
// SIGHUP (an operator asking for a reload, or a closed terminal) and SIGUSR1/SIGUSR2 would end the
// process without a graceful shutdown: SIGHUP reads the token files again (docs/operations.md,
// "Rotating tokens"; with no token files there is nothing to reload), the others are logged and
// ignored.
sigaddset(&signals, SIGHUP)
sigaddset(&signals, SIGUSR1)
sigaddset(&signals, SIGUSR2)
pthread_sigmask(SIG_BLOCK, &signals, nil)
signal(SIGPIPE, SIG_IGN)
/// The blocked signals above, as they arrive (first the main thread's, then, once shutdown has
/// begun, the signal thread's; one reader at a time).
let signalFD = signalfd(-1, &signals, Int32(SFD_CLOEXEC))
if signalFD < 0 {
    ServerLog.standardError("forge-push-token-server: signalfd: \(systemErrorText(errno))\n")
    exit(1)
}

/// The next of the blocked signals (blocks until one arrives).
func nextSignal() -> Int32 {
    var info = signalfd_siginfo()
    while true {
        let count = withUnsafeMutableBytes(of: &info) { read(signalFD, $0.baseAddress, $0.count) }
        if count == MemoryLayout<signalfd_siginfo>.size { return Int32(info.ssi_signo) }
    }
}

/// Test-only (e2e/drain_test.py, `crash`): with `FPT_TEST_CRASH_ON_SIGUSR2=1` in the environment,
/// SIGUSR2 makes another thread than the one reading signals stop on a fatal error, as a bug
/// would, while the signals are being waited for: the test sees the runtime's backtrace and the
/// process's end. Unset, SIGUSR2 is logged and ignored, as always.
let crashOnSIGUSR2 = ProcessInfo.processInfo.environment["FPT_TEST_CRASH_ON_SIGUSR2"] == "1"

/// The deliberate crash of `crashOnSIGUSR2`, on a Dispatch worker thread.
func crashElsewhere() {
    DispatchQueue.global().async { fatalError("deliberate crash on SIGUSR2 (FPT_TEST_CRASH_ON_SIGUSR2=1)") }
}

/// Writes a fatal error to standard error: as it is in the text format, as one `ERROR` line in the
/// json format (so that every line of the log parses, even the last one).
func printError(_ text: String, format: ServerLog.Format = .text) {
    if format == .json {
        ServerLog(minimumLevel: .error, format: .json).log(.error, text)
    } else {
        ServerLog.standardError(text.hasSuffix("\n") ? text : text + "\n")
    }
}

let options: CommandLineOptions
do {
    options = try CommandLineOptions.parse(
        Array(CommandLine.arguments.dropFirst()),
        environment: ProcessInfo.processInfo.environment)
} catch {
    // The options did not parse, but a log pipeline still wants JSON when it was asked for.
    if CommandLineOptions.requestedLogFormat(
        Array(CommandLine.arguments.dropFirst()),
        environment: ProcessInfo.processInfo.environment) == .json
    {
        printError("forge-push-token-server: \(error) (see \(CommandLineFlag.help))", format: .json)
    } else {
        printError("forge-push-token-server: \(error)\n\n\(CommandLineOptions.usage)")
    }
    exit(64)
}
switch options.action {
case .help:
    print(CommandLineOptions.usage)
    exit(0)
case .version:
    print("forge-push-token-server \(serverVersion)")
    exit(0)
case .healthCheck:
    exit(HealthCheck.run(options.server, probe: options.healthCheckProbe) ? 0 : 1)
case .run:
    break
}

let log = ServerLog(minimumLevel: options.logLevel, format: options.logFormat)
// The store keeps the versioned token; the owner serves it (docs/architecture.md).
let store: any TokenStore
let initial: TokenState
var initialHealth = StoreHealth.ok
if let redis = options.redis {
    // A replica: Redis keeps the state (docs/replicas.md). Until the state is read the replica
    // knows no token and says it is starting; the store connects in the background.
    store = RedisTokenStore(configuration: redis, log: { level, message in log.log(level, message) })
    initial = .initial
    initialHealth = RedisTokenStore.healthAtStart
    log.log(.info, "replica of \(redis.endpoint), key prefix \(redis.prefix)")
} else if let path = options.stateFile {
    let fileStore = StateFileStore(file: StateFile(path: path))
    do {
        initial = try fileStore.load()
    } catch {
        printError("forge-push-token-server: \(error)", format: options.logFormat)
        exit(1)
    }
    // Found now, not at the first change: a folder that is missing or not writable.
    guard access(fileStore.file.folder, W_OK) == 0 else {
        printError(
            "forge-push-token-server: the folder of state file \(path) is missing or not writable: "
                + systemErrorText(errno), format: options.logFormat)
        exit(1)
    }
    // A relative path names a file in the working directory: the log says which one.
    var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
    let directory = buffer.withUnsafeMutableBufferPointer { buffer in
        getcwd(buffer.baseAddress, buffer.count).map { String(cString: $0) }
    }
    let whereRelative = path.hasPrefix("/") ? "" : directory.map { " (in \($0))" } ?? ""
    log.log(.info, "state file \(path)\(whereRelative): version \(initial.version)")
    store = fileStore
} else {
    store = MemoryTokenStore()
    initial = .initial
}
// The owner over the store and the responder, wired as every test and the fuzz harness wire them
// (Service); a store shared by replicas (Redis) turns on the replica mode itself.
let service = Service(
    store: store, initial: initial, health: initialHealth,
    settings: Service.Settings(
        authentication: options.authentication, crossOrigin: options.crossOrigin, accessLog: options.accessLog,
        maxSubscribers: options.server.maxSubscribers, drainSeconds: options.drainSeconds,
        maxStreamAge: options.maxStreamAge),
    log: log)
let responder = service.responder
responder.metrics.setBuildVersion(serverVersion)
for warning in options.startupWarnings {
    log.log(.warning, warning)
}
// The token files are read again on SIGHUP and when they change (docs/operations.md, "Rotating tokens").
let reloader = options.writeTokenFile.map { path in
    CredentialReloader(
        writePath: path, readPath: options.readTokenFile, responder: responder, log: log,
        signatures: options.tokenFileSignatures)
}
let server: MicroHTTPDServer<Responder>
do {
    server = try MicroHTTPDServer(configuration: options.server, application: responder, log: log)
    try server.start()
} catch {
    printError("forge-push-token-server: \(error)", format: options.logFormat)
    exit(1)
}
reloader?.start()

var received: Int32 = 0
while true {
    received = nextSignal()
    if received == SIGUSR2 && crashOnSIGUSR2 { crashElsewhere() }
    if received == SIGTERM || received == SIGINT { break }
    if received == SIGHUP, let reloader {
        reloader.reload(because: "SIGHUP")
        continue
    }
    let name = received == SIGHUP ? "SIGHUP" : received == SIGUSR1 ? "SIGUSR1" : "SIGUSR2"
    let what = received == SIGHUP ? "no token files to reload" : "nothing to do"
    log.log(.info, "received \(name): \(what); ignored (SIGTERM or SIGINT stops the service)")
}
log.log(.info, "received \(received == SIGTERM ? "SIGTERM" : "SIGINT"), shutting down")
// From here the signals are another thread's: a second SIGTERM or SIGINT cuts a drain short
// (Service.hurry); SIGHUP and the others change nothing about it (docs/operations.md).
DispatchQueue(label: "forge-push-token.signals").async { [service, log] in
    while true {
        let signal = nextSignal()
        if signal == SIGUSR2 && crashOnSIGUSR2 { crashElsewhere() }
        if signal == SIGTERM || signal == SIGINT {
            log.log(.info, "received \(signal == SIGTERM ? "SIGTERM" : "SIGINT") again: ending the streams at once")
            service.hurry()
        } else {
            let name = signal == SIGHUP ? "SIGHUP" : signal == SIGUSR1 ? "SIGUSR1" : "SIGUSR2"
            log.log(.info, "received \(name) while stopping; ignored (the drain goes on)")
        }
    }
}
// The one shutdown order (Service.shutdown): drain, end the streams, stop accepting, the grace
// period, stop the server, close the store.
service.shutdown(engine: server)
exit(0)
