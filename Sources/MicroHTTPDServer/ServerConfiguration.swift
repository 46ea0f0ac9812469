import HTTPServing
import ServerSupport

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
    /// Seconds from the moment graceful shutdown stops accepting connections to the end of the
    /// process's shutdown: requests in flight get all but the last
    /// `MicroHTTPDServer.finalStepsSeconds` of it to finish; then what is left is answered or
    /// closed and the store closed (`MicroHTTPDServer.stop()`, `Service.close()`). Default 3.
    public var shutdownGraceSeconds: Double = 3
    /// The clock every time decision of the engine reads (`ServerClock`: request deadlines,
    /// durations in records, ticks, heartbeats, stalled streams). Default `.monotonic`; tests give
    /// a manual one (Tests/TestSupport's `ManualServerClock`).
    public var clock: ServerClock = .monotonic

    /// The most bytes a request head may cost (`--max-header-bytes`; `RequestHeadBudget`): its
    /// line, header fields and blank line as sent, plus 48 bytes per field, query argument and
    /// cookie (libmicrohttpd's record of each) and the `Cookie` field's copy. A head over it gets
    /// `431 header_fields_too_large` before anything is carried out. Within
    /// `RequestHeadBudget.maxHeaderBytesRange` (clamped otherwise). Default 36,320, which makes a
    /// 40 KiB pool (`connectionMemoryLimit`): a browser's `EventSource` request with 8 KiB of
    /// cookies fits.
    public var maxHeaderBytes: Int = RequestHeadBudget.defaultMaxHeaderBytes

    /// The budget `maxHeaderBytes` sets.
    public var headBudget: RequestHeadBudget { RequestHeadBudget(maxHeaderBytes: maxHeaderBytes) }

    /// Bytes of libmicrohttpd's per-connection memory pool (`MHD_OPTION_CONNECTION_MEMORY_LIMIT`),
    /// derived from `maxHeaderBytes` so that every answer fits beside any head within it
    /// (`RequestHeadBudget.poolBytes`; 40,960 by default). The pool holds a request's line and
    /// header fields and the response's header block and chunk buffer, for as long as libmicrohttpd
    /// keeps the connection: a plain-HTTP stream gives it back when it is handed over, a TLS stream
    /// keeps it. libmicrohttpd maps a pool over 32 KiB, whose pages cost nothing until touched, and
    /// zeroes all of any pool between two requests on one connection, so an idle keep-alive
    /// connection holds all of it (docs/performance.md, "Memory per subscriber").
    /// A head that does not even fit in the pool is answered by libmicrohttpd itself (431 or 414,
    /// HTML).
    public var connectionMemoryLimit: Int { headBudget.poolBytes }

    /// Seconds an ordinary connection may stay idle before libmicrohttpd closes it
    /// (`MHD_OPTION_CONNECTION_TIMEOUT`), so idle sockets cannot hold the connection limit forever.
    /// Event streams are exempt (they stay open while idle; a departed client is noticed by its
    /// socket). Default 60.
    public var idleTimeoutSeconds: Int = 60

    /// Seconds a request's head may take to arrive, and then its body (`--header-timeout`;
    /// `RequestDeadline`): over it, a `408 request_timeout` where one can be sent (plain HTTP) and
    /// the connection is closed. libmicrohttpd's idle timeout restarts on every byte, so without it
    /// a client sending a header line every few seconds held a connection forever. Event streams
    /// are exempt once established. Default 10 (as nginx's `client_header_timeout` is 60).
    public var headerTimeoutSeconds: Int = RequestDeadline.defaultSeconds

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

    /// The most connections open at once, event streams included (`--max-connections`); a
    /// connection over it is closed as soon as it is accepted. `nil` (the default) means room for
    /// every subscriber plus 1,024 ordinary connections, so plain requests get through at the
    /// subscriber limit (subscribers over that limit are refused by the service with a 503).
    public var maxConnections: Int?

    /// The most connections open at once from one client IP address (`--max-connections-per-ip`);
    /// 0 (the default) means no such limit, since behind a reverse proxy or Docker's port mapping
    /// every client has the same address.
    public var maxConnectionsPerAddress: Int = 0

    /// The longest request target (path and query, as sent) in bytes (`--max-url-bytes`); a
    /// longer one gets 414 `uri_too_long`. Default 2048. A target that does not even fit in the
    /// connection's memory pool gets libmicrohttpd's own 414 page.
    public var maxURLBytes: Int = 2048

    /// Whether event streams over plain HTTP/1.1 are handed over from libmicrohttpd to the engine's
    /// own writer once admitted (`DetachedStream`; docs/architecture.md, "Detached streams"), which
    /// frees libmicrohttpd's pool for the stream's life. Default `true`; with `tls` set, streams
    /// always stay in libmicrohttpd. `false` keeps every stream there (the tests run both paths).
    public var detachesStreams = true

    /// The certificate and private key for HTTPS, or `nil` for plain HTTP (the default).
    public var tls: TLSCredentials?

    /// The connection limit in force: `maxConnections`, or `maxSubscribers + 1024`.
    public var connectionLimit: Int { maxConnections ?? maxSubscribers + 1024 }
}

/// A certificate chain and its private key, each PEM text (RFC 7468), for libmicrohttpd's
/// HTTPS support through GnuTLS (`MHD_USE_TLS`, `MHD_OPTION_HTTPS_MEM_CERT`,
/// `MHD_OPTION_HTTPS_MEM_KEY`; libmicrohttpd manual, "microhttpd-init"). The key must not be
/// encrypted. Its `description` never shows the key.
public struct TLSCredentials: Sendable, Equatable, CustomStringConvertible {
    /// The server's certificate, then any intermediate certificates, PEM.
    public var certificatePEM: String
    /// The certificate's private key, PEM, unencrypted.
    public var privateKeyPEM: String

    /// Creates credentials from PEM texts.
    public init(certificatePEM: String, privateKeyPEM: String) {
        self.certificatePEM = certificatePEM
        self.privateKeyPEM = privateKeyPEM
    }

    /// `TLSCredentials(certificate: N bytes, key: <redacted>)`.
    public var description: String {
        "TLSCredentials(certificate: \(certificatePEM.utf8.count) bytes, key: <redacted>)"
    }
}
