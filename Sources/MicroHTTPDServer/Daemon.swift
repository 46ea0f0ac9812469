import CMicroHTTPD
import ForgePushToken
import HTTPServing
import ServerSupport

/// What one daemon's callbacks receive as their `cls`: the loop that runs that daemon (which a
/// resumed connection must wake), its connections' deadlines, and the server's limits; the
/// callbacks that need the application are overridden by `Daemon<Application>`.
///
/// Why a class with overrides: libmicrohttpd's callbacks are C function pointers, which cannot be
/// generic, and the engine is generic over its application. A C callback calls this class's
/// method (one virtual call), and `Daemon<Application>`'s override runs the engine's code with the
/// application's type known: no existential, no allocation. The base class is never made alone.
///
/// `@unchecked Sendable` (a class open to a subclass cannot be checked): every stored property is
/// a `let` of a `Sendable` type, and `Daemon` adds only such properties too.
///
/// Retained by the server's running state until after `MHD_stop_daemon`.
class DaemonContext: @unchecked Sendable {
    let loop: DaemonLoop
    /// The request deadlines of this daemon's connections (used on the loop's thread only).
    let deadlines = ConnectionDeadlines()
    /// The server's connection limits, shared by every daemon.
    let limiter: ConnectionLimiter
    /// `ServerConfiguration.maxURLBytes`.
    let maxURLBytes: Int
    /// The event streams this daemon's loop serves (`DetachedStream`), written by its loop.
    let detached: DetachedStreams
    /// Every daemon loop's detached streams (this one's among them): a stream handed over here is
    /// served by the least loaded.
    let detachedLoops: [DetachedStreams]
    /// `ServerConfiguration.clock`: what the callbacks read the time on.
    let clock: ServerClock

    init(
        loop: DaemonLoop, limiter: ConnectionLimiter, maxURLBytes: Int, detached: DetachedStreams,
        detachedLoops: [DetachedStreams], clock: ServerClock
    ) {
        self.loop = loop
        self.clock = clock
        self.limiter = limiter
        self.maxURLBytes = maxURLBytes
        self.detached = detached
        self.detachedLoops = detachedLoops
    }

    /// The access handler (`mhdAccessHandler`): see `Daemon.accessHandler`.
    func accessHandler(
        connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
        version: UnsafePointer<CChar>?, uploadData: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>,
        slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    ) -> MHD_Result {
        preconditionFailure("DaemonContext is only made as a Daemon")
    }

    /// The request-completed callback (`mhdRequestCompleted`): see `Daemon.requestCompleted`.
    func requestCompleted(_ slot: RequestSlot, connection: OpaquePointer?) {
        preconditionFailure("DaemonContext is only made as a Daemon")
    }

    /// The accept policy (`mhdAcceptPolicy`): see `Daemon.admitConnection`.
    func admitConnection(from client: ClientAddress?) -> Bool {
        preconditionFailure("DaemonContext is only made as a Daemon")
    }
}

/// One daemon of a `MicroHTTPDServer<Application>`: the callbacks that ask the application
/// (RequestHandling.swift, EventStream.swift, ConnectionLimits.swift).
final class Daemon<Application: HTTPApplication>: DaemonContext, @unchecked Sendable {
    /// The server (retained: the server's running state holds this daemon until `stop()`).
    let server: MicroHTTPDServer<Application>

    /// The application the server serves (the server's, copied once: this code is not
    /// specialised for `Application`, and reading it through `server` looked up the server's
    /// generic metadata on each of the ten reads a request makes).
    let application: Application
    /// The application's traits (`HTTPApplicationTraits`), copied once from the server.
    let traits: HTTPApplicationTraits
    /// The application as `HTTPCachedReads` (`MicroHTTPDServer.cachedReader`), copied once.
    let cachedReader: (any HTTPCachedReads)?
    /// The cached read's path (`HTTPApplicationTraits.cachedReadPath`; empty without one).
    let cachedReadPath: StaticString

    /// The context of a request the application answered, and of one it admitted.
    typealias Labelled = LabelledRequestContext<Application.Label>
    typealias Admitted = AdmittedRequestContext<Application.Admitted, Application.Label>
    /// Their metatypes, looked up once: a context made from a metatype value needs no look-up of
    /// its generic metadata, which this unspecialised code would otherwise make per request.
    let labelledType: Labelled.Type = Labelled.self
    let admittedType: Admitted.Type = Admitted.self

    /// The header fields and query parameters the first pass over a request's records keeps
    /// (the engine's and the application's).
    let capture: HeadFieldCapture

    /// This daemon's logger (`MHD_OPTION_EXTERNAL_LOGGER`'s context): told of each hand-over line
    /// the daemon is about to log.
    let logBox: LogBox
    /// The server's `copySocket`, copied once.
    let copySocket: @Sendable (Int32) -> Int32

    /// A daemon run by `loop`, whose detached streams are `detached` (one of `detachedLoops`).
    init(
        server: MicroHTTPDServer<Application>, loop: DaemonLoop, detached: DetachedStreams,
        detachedLoops: [DetachedStreams], logBox: LogBox
    ) {
        self.server = server
        self.logBox = logBox
        self.copySocket = server.copySocket
        self.application = server.application
        self.traits = server.traits
        self.cachedReader = server.cachedReader
        self.cachedReadPath = server.traits.cachedReadPath ?? ""
        self.capture = HeadFieldCapture(
            headerFields: server.traits.headerFieldsRead, queryParameters: server.traits.queryParametersRead)
        super.init(
            loop: loop, limiter: server.limiter, maxURLBytes: server.configuration.maxURLBytes,
            detached: detached, detachedLoops: detachedLoops, clock: server.configuration.clock)
    }

    override func accessHandler(
        connection: OpaquePointer, url: UnsafePointer<CChar>, method: UnsafePointer<CChar>,
        version: UnsafePointer<CChar>?, uploadData: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>,
        slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>
    ) -> MHD_Result {
        handle(
            RequestCall(
                connection: connection, url: url, method: method, version: version, uploadData: uploadData,
                uploadSize: uploadSize, slot: slot))
    }

    override func requestCompleted(_ slot: RequestSlot, connection: OpaquePointer?) {
        finish(slot, connection: connection)
    }

    override func admitConnection(from client: ClientAddress?) -> Bool {
        server.admitConnection(from: client)
    }
}

/// One call of the access handler, its C arguments as libmicrohttpd gave them (valid for the call).
struct RequestCall {
    let connection: OpaquePointer
    /// The path, percent-decoded, without the query.
    let url: UnsafePointer<CChar>
    let method: UnsafePointer<CChar>
    let version: UnsafePointer<CChar>?
    /// This call's piece of body, or `nil`.
    let uploadData: UnsafePointer<CChar>?
    /// Its size; set to 0 once the piece is taken.
    let uploadSize: UnsafeMutablePointer<Int>
    /// The request's slot (`*con_cls`, `RequestSlot`).
    let slot: UnsafeMutablePointer<UnsafeMutableRawPointer?>
}
