import ForgePushToken
import ForgePushTokenOwner
import ForgePushTokenTestSupport
import HTTPServing
import MicroHTTPDServer
import ServerSupport
import TokenService

#if canImport(Glibc)
    import Glibc
#endif

/// The service behind the engine on a free loopback port, for one test: the executable's wiring
/// (`Service`, `Responder` as the engine's application), over real sockets.
final class LiveServer {
    let server: MicroHTTPDServer<Responder>
    /// The service the server serves, as the executable composes it.
    let service: Service
    let port: UInt16
    let responder: Responder
    /// The token's owner behind the responder (in memory).
    let owner: TokenOwner<TokenSnapshot>
    let lines = Locked<[String]>([])

    /// A server over `store`, built as the executable builds it (`Service`), on a free port.
    init(
        authentication: BearerAuthentication? = nil, crossOrigin: CrossOriginPolicy = CrossOriginPolicy(),
        store: any TokenStore = MemoryTokenStore(), logFormat: ServerLog.Format = .text, accessLog: Bool = true,
        _ configure: (inout ServerConfiguration) -> Void = { _ in }
    ) throws {
        var configuration = ServerConfiguration()
        configuration.host = "127.0.0.1"
        configuration.port = 0
        configure(&configuration)
        let lines = self.lines
        let log = ServerLog(minimumLevel: .debug, format: logFormat) { line in lines.withLock { $0.append(line) } }
        let service = Service(
            store: store,
            settings: Service.Settings(
                authentication: authentication, crossOrigin: crossOrigin, accessLog: accessLog,
                maxSubscribers: configuration.maxSubscribers, clock: configuration.clock),
            log: log)
        self.service = service
        owner = service.owner
        responder = service.responder
        server = try MicroHTTPDServer(configuration: configuration, application: responder, log: log)
        let authority = try server.start()
        port = UInt16(authority.split(separator: ":").last!)!
    }

    deinit {
        // A manual clock runs free for the shutdown: its waits must end without the test.
        server.configuration.clock.runFree()
        service.shutdown(engine: server)
    }

    func client() throws -> TestClient { try TestClient(port: port) }

    /// Registers `deviceToken` through the owner, as `POST /register` would, and waits for it.
    func register(_ deviceToken: [UInt8]) {
        _ = owner.commit(DeviceTokenHex.encode(deviceToken))
    }

    /// One request on a new connection.
    func request(_ method: String, _ target: String, body: [UInt8] = [], headers: [String: String] = [:]) throws
        -> TestResponse
    {
        let client = try client()
        defer { client.close() }
        return try client.request(method, target, body: body, headers: headers)
    }
}

/// The project's manual clock, read by the engine and the service through `ServerClock.manual(_:)`.
extension ManualServerClock: ServerTimeSource {}
