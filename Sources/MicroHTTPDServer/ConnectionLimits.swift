import CMicroHTTPD
import ForgePushToken
import HTTPServing

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
            let ipv4 = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) {
                UInt32(bigEndian: $0.pointee.sin_addr.s_addr)
            }
            high = 0
            low = 0xFFFF_0000_0000 | UInt64(ipv4)
        case AF_INET6:
            // Read in place: this runs for every accepted connection.
            (high, low) = address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                withUnsafeBytes(of: pointer.pointee.sin6_addr) { bytes in
                    (
                        UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
                        UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
                    )
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

    /// How many admitted connections libmicrohttpd has not yet reported closed: the event a test
    /// waits for to know that the server accepted a connection, or closed one (a client's reset).
    var openCount: Int {
        state.withLock { $0.total }
    }

    /// Gives back the place of an admitted connection from `address`.
    func release(_ address: ClientAddress?) {
        state.withLock { state in
            state.total = max(0, state.total - 1)
            guard maxPerAddress > 0, let address, let count = state.perAddress[address] else { return }
            if count <= 1 { state.perAddress[address] = nil } else { state.perAddress[address] = count - 1 }
        }
    }
}

extension MicroHTTPDServer {
    /// Admits a new connection from `client` (`mhdAcceptPolicy`), or refuses it: counted in the
    /// metrics and logged (at most once per 10 s). libmicrohttpd then closes a refused connection
    /// without an answer (it has no way to answer it first).
    ///
    /// A place reserved here is given back when libmicrohttpd reports the connection closed
    /// (`mhdConnectionNotify`). Between the two, libmicrohttpd only fails to set the connection up
    /// when it runs out of memory or reaches its own connection limit; the server sets that limit
    /// above `maxTotal`, so it is never reached first.
    func admitConnection(from client: ClientAddress?) -> Bool {
        switch limiter.admit(client) {
        case .admitted:
            return true
        case .refusedTotal:
            application.record(.connectionRefusedTotalLimit)
            warnOfRefusals("\(limiter.maxTotal) connections are open (--max-connections)")
            return false
        case .refusedPerAddress:
            application.record(.connectionRefusedPerAddressLimit)
            warnOfRefusals("a client address has \(limiter.maxPerAddress) connections open (--max-connections-per-ip)")
            return false
        }
    }
}

/// What is wrong with a request target `uri` (path and query, still percent-encoded, as
/// `mhdURILog` sees it): over `limit` bytes, a space or control character, or `%00` or `%2F` in
/// its path; `nil` when nothing is.
func targetFlaw(_ uri: UnsafePointer<CChar>, limit: Int) -> TargetFlaw? {
    let length = strnlen(uri, limit + 1)
    if length > limit { return .tooLong }
    return uri.withMemoryRebound(to: UInt8.self, capacity: length) { bytes in
        var index = 0
        var inPath = true
        var flaw: TargetFlaw?
        while index < length {
            let byte = bytes[index]
            if !RequestFraming.isAllowedInTarget(byte) { return .malformed }
            if byte == UInt8(ascii: "?") { inPath = false }
            if inPath, flaw == nil, byte == UInt8(ascii: "%"), index + 2 < length {
                let high = bytes[index + 1]
                let low = bytes[index + 2] | 0x20
                if high == UInt8(ascii: "0") && low == UInt8(ascii: "0") { flaw = .encodedNUL }
                if high == UInt8(ascii: "2") && low == UInt8(ascii: "f") { flaw = .encodedSlash }
            }
            index += 1
        }
        return flaw
    }
}
