import CMicroHTTPD
import ForgePushToken
import ForgePushTokenHTTP
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A client's IP address as a hashable value: IPv6 as its 16 bytes, IPv4 as its IPv4-mapped IPv6
/// form (`::ffff:a.b.c.d`, RFC 4291 §2.5.5.2), so that one client counts once on a dual-stack
/// socket whichever way its address is written.
struct ClientAddress: Hashable, Sendable {
    let high: UInt64
    let low: UInt64

    /// The address of an IPv4 (`sockaddr_in`) or IPv6 (`sockaddr_in6`) socket address; `nil` for
    /// any other family.
    init?(_ address: UnsafePointer<sockaddr>) {
        switch Int32(address.pointee.sa_family) {
        case AF_INET:
            let ipv4 = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt32(bigEndian: $0.pointee.sin_addr.s_addr) }
            high = 0
            low = 0xFFFF_0000_0000 | UInt64(ipv4)
        case AF_INET6:
            // Read in place: this runs for every accepted connection.
            (high, low) = address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                withUnsafeBytes(of: pointer.pointee.sin6_addr) { bytes in
                    (UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
                     UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
                }
            }
        default:
            return nil
        }
    }

    init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }
}

/// Counts the open connections, in all and per client address, across every daemon of a server,
/// and decides whether a new one may stay (`--max-connections`, `--max-connections-per-ip`).
///
/// A state machine under one lock: `admit` reserves a place or refuses, `release` gives it back.
/// Thread-safety: all members may be called from any thread.
final class ConnectionLimiter: Sendable {
    /// Why a connection was refused, or that it was admitted.
    enum Admission: Equatable {
        case admitted
        case refusedTotal
        case refusedPerAddress
    }

    /// The most connections open at once.
    let maxTotal: Int
    /// The most connections open at once from one address; 0 means no such limit.
    let maxPerAddress: Int
    private let state = Locked(State())

    private struct State {
        var total = 0
        var perAddress: [ClientAddress: Int] = [:]
    }

    init(maxTotal: Int, maxPerAddress: Int) {
        self.maxTotal = maxTotal
        self.maxPerAddress = maxPerAddress
    }

    /// Reserves a place for a connection from `address`, or says which limit refuses it.
    func admit(_ address: ClientAddress?) -> Admission {
        state.withLock { state in
            guard state.total < maxTotal else { return .refusedTotal }
            if maxPerAddress > 0, let address {
                let count = state.perAddress[address, default: 0]
                guard count < maxPerAddress else { return .refusedPerAddress }
                state.perAddress[address] = count + 1
            }
            state.total += 1
            return .admitted
        }
    }

    /// Gives back the place of an admitted connection from `address`.
    func release(_ address: ClientAddress?) {
        state.withLock { state in
            state.total = max(0, state.total - 1)
            guard maxPerAddress > 0, let address, let count = state.perAddress[address] else { return }
            if count <= 1 { state.perAddress[address] = nil } else { state.perAddress[address] = count - 1 }
        }
    }

    /// Connections open now (admitted, not yet released).
    var openCount: Int { state.withLock { $0.total } }
    /// Addresses with at least one open connection, when a per-address limit is set.
    var addressCount: Int { state.withLock { $0.perAddress.count } }
}

/// `*socket_context` of an admitted connection, from `MHD_CONNECTION_NOTIFY_STARTED` on: a marker
/// (address 1, never dereferenced) saying that the connection holds a place in the limiter.
private var admittedMarker: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 1)! }

/// `MHD_AcceptPolicyCallback`: admits a new connection or has libmicrohttpd close it at once.
/// libmicrohttpd calls it before it allocates anything for the connection; a refused client sees
/// its connection closed without an answer (libmicrohttpd has no way to answer it first).
///
/// A place reserved here is given back when libmicrohttpd reports the connection closed. Between
/// the two, libmicrohttpd only fails to set the connection up when it runs out of memory or
/// reaches its own connection limit; the server sets that limit above `maxTotal`, so it is never
/// reached first.
func mhdAcceptPolicy(_ cls: UnsafeMutableRawPointer?, _ address: UnsafePointer<sockaddr>?, _ length: socklen_t) -> MHD_Result {
    guard let cls else { return .NO }
    let server = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue().server
    let client = address.flatMap(ClientAddress.init)
    switch server.limiter.admit(client) {
    case .admitted:
        return .YES
    case .refusedTotal:
        server.responder.metrics.increment(.connectionsRefusedTotalLimit)
        server.warnOfRefusals("\(server.limiter.maxTotal) connections are open (--max-connections)")
        return .NO
    case .refusedPerAddress:
        server.responder.metrics.increment(.connectionsRefusedPerAddressLimit)
        server.warnOfRefusals("a client address has \(server.limiter.maxPerAddress) connections open (--max-connections-per-ip)")
        return .NO
    }
}

/// `MHD_NotifyConnectionCallback`: marks a connection as holding a place when it starts, and gives
/// the place back when it closes.
func mhdConnectionNotify(_ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                         _ socketContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
                         _ code: MHD_ConnectionNotificationCode) {
    guard let cls, let connection, let socketContext else { return }
    let server = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue().server
    switch code.rawValue {
    case 0:  // MHD_CONNECTION_NOTIFY_STARTED
        socketContext.pointee = admittedMarker
    case 1:  // MHD_CONNECTION_NOTIFY_CLOSED
        guard socketContext.pointee == admittedMarker else { return }
        socketContext.pointee = nil
        server.limiter.release(fpt_connection_address(connection).flatMap(ClientAddress.init))
    default:
        return
    }
}

/// `*con_cls` of a request whose target is longer than `ServerConfiguration.maxURLBytes`, set by
/// `mhdURILog` before the first access-handler call: a marker (address 3, never dereferenced).
var uriTooLongMarker: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 3)! }
/// `*con_cls` of a request whose path holds `%00`, which libmicrohttpd would decode into a NUL that
/// ends the path it hands over (`/token%00x` would be served as `/token`): address 4.
var encodedNULMarker: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 4)! }
/// `*con_cls` of a request whose path holds `%2F`, an encoded slash, which is data and not a
/// path separator (RFC 3986 §2.2), so `/token%2Fstream` names no route; libmicrohttpd would
/// decode it into `/token/stream`: address 5.
var encodedSlashMarker: UnsafeMutableRawPointer { UnsafeMutableRawPointer(bitPattern: 5)! }

/// Whether `pointer` is one of the markers `mhdURILog` sets.
func isTargetMarker(_ pointer: UnsafeMutableRawPointer?) -> Bool {
    pointer == uriTooLongMarker || pointer == encodedNULMarker || pointer == encodedSlashMarker
}

/// libmicrohttpd's URI-log callback (`MHD_OPTION_URI_LOG_CALLBACK`): sees each request target as
/// sent (path and query, still percent-encoded) before it is parsed. Its result is the request's
/// first `*con_cls`: a marker for a target over the limit or with `%00` or `%2F` in its path,
/// else `NULL`.
func mhdURILog(_ cls: UnsafeMutableRawPointer?, _ uri: UnsafePointer<CChar>?, _ connection: OpaquePointer?) -> UnsafeMutableRawPointer? {
    guard let cls, let uri else { return nil }
    let limit = Unmanaged<DaemonContext>.fromOpaque(cls).takeUnretainedValue().server.configuration.maxURLBytes
    let length = strnlen(uri, limit + 1)
    if length > limit { return uriTooLongMarker }
    return uri.withMemoryRebound(to: UInt8.self, capacity: length) { bytes in
        var index = 0
        while index < length, bytes[index] != UInt8(ascii: "?") {
            if bytes[index] == UInt8(ascii: "%"), index + 2 < length {
                let high = bytes[index + 1], low = bytes[index + 2] | 0x20
                if high == UInt8(ascii: "0") && low == UInt8(ascii: "0") { return encodedNULMarker }
                if high == UInt8(ascii: "2") && low == UInt8(ascii: "f") { return encodedSlashMarker }
            }
            index += 1
        }
        return nil
    }
}
