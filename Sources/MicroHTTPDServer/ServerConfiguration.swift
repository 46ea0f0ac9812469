#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

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

    /// Bytes of libmicrohttpd's per-connection memory pool (`MHD_OPTION_CONNECTION_MEMORY_LIMIT`),
    /// which holds a request's line and header fields and the response's header block and chunk
    /// buffer. libmicrohttpd touches all of it for every connection, so it is most of the memory of
    /// an idle subscriber, and it zeroes all of it between two requests on one connection. A request
    /// whose line and header fields do not fit is answered by libmicrohttpd itself (431 or 414).
    /// Default 8192 (libmicrohttpd's own default is 32768). Not smaller: the response's header block
    /// must fit beside the request's, and at 4096 a request with about 3.7 KB of header fields
    /// (ordinary cookies) was carried out but its connection closed without an answer.
    public var connectionMemoryLimit: Int = 8192

    /// Seconds an ordinary connection may stay idle before libmicrohttpd closes it
    /// (`MHD_OPTION_CONNECTION_TIMEOUT`), so idle sockets cannot hold the connection limit forever.
    /// Event streams are exempt (they stay open while idle; a departed client is noticed by its
    /// socket). Default 60.
    public var idleTimeoutSeconds: Int = 60

    /// Threads serving connections, each running one libmicrohttpd daemon with its own epoll set;
    /// all take connections from the one listening socket (as libmicrohttpd's own thread pool
    /// does). Idle event streams cost no thread (they are suspended); more threads spread request
    /// handling and the fan-out of an event over the cores (on loopback, writing an event to a
    /// subscriber's socket is most of a publish's cost). Default: the online cores, at most 8.
    public var threads: Int = ServerConfiguration.defaultThreads

    /// The online cores (`sysconf(_SC_NPROCESSORS_ONLN)`), at least 1 and at most 8.
    public static var defaultThreads: Int {
        min(8, max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))))
    }

    /// Creates the default configuration.
    public init() {}

    /// The connection limit given to libmicrohttpd (`MHD_OPTION_CONNECTION_LIMIT`): room for every
    /// subscriber plus 1,024 ordinary connections, so plain requests get through at the
    /// subscriber limit (subscribers over the limit are refused by the service with a 503).
    public var connectionLimit: Int { maxSubscribers + 1024 }
}
