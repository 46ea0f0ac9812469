/// How a `MicroHTTPDServer` listens and what it allows. Defaults follow http-api.md.
public struct ServerConfiguration: Sendable, Equatable {
    /// The address to listen on: an IPv4 or IPv6 literal, or `localhost` (which means
    /// `127.0.0.1`). Default `127.0.0.1`.
    public var host: String = "127.0.0.1"
    /// The TCP port; 0 picks a free one (the bound port is reported by `start()`). Default 8080.
    public var port: UInt16 = 8080
    /// The largest request body accepted, in bytes; larger ones get 413. Default 4096.
    public var maxBodyBytes: Int = 4096
    /// The most event-stream subscribers at once; more get 503. Default 10,000.
    public var maxSubscribers: Int = 10_000
    /// Seconds between `: keep-alive` comments on an idle event stream (≥ 1). Default 15.
    public var heartbeatSeconds: Int = 15
    /// Whether one access-log line is written per request. Default on.
    public var accessLog: Bool = true
    /// Seconds that graceful shutdown gives requests in flight before closing them. Default 3.
    public var shutdownGraceSeconds: Double = 3

    /// Creates the default configuration.
    public init() {}

    /// The connection limit given to libmicrohttpd (`MHD_OPTION_CONNECTION_LIMIT`): room for every
    /// subscriber plus 1,024 ordinary connections, so plain requests get through at the
    /// subscriber limit (subscribers over the limit are refused by the service with a 503).
    public var connectionLimit: Int { maxSubscribers + 1024 }
}
