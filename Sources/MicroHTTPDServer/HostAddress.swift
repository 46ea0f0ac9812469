#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The `--host` value and what follows from it, in one place: the service's command line, its
/// listening socket and its health check read a host the same way.
///
/// A host is `localhost` or an IPv4 or IPv6 literal, IPv6 with or without brackets (`::1`,
/// `[::1]`); no name is ever looked up.
public enum HostAddress {
    /// The literal to bind or connect to: `127.0.0.1` for `localhost`, `::1` for `[::1]`.
    public static func literal(_ host: String) -> String {
        if host == "localhost" { return "127.0.0.1" }
        return host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
    }

    /// Whether `host` is `localhost` or an IPv4 or IPv6 literal (`inet_pton(3)`).
    public static func isValid(_ host: String) -> Bool {
        let literal = literal(host)
        var buffer = [UInt8](repeating: 0, count: 16)
        return inet_pton(AF_INET, literal, &buffer) == 1 || inet_pton(AF_INET6, literal, &buffer) == 1
    }

    /// Whether `host` names this machine only (`localhost`, `127.0.0.0/8`, `::1`).
    public static func isLoopback(_ host: String) -> Bool {
        let literal = literal(host)
        return literal == "::1" || literal.hasPrefix("127.")
    }

    /// The address a client on this machine reaches `host` at: its loopback address for a
    /// wildcard (`0.0.0.0`, `::`), else its literal.
    public static func reachable(_ host: String) -> String {
        switch literal(host) {
        case "0.0.0.0": "127.0.0.1"
        case "::": "::1"
        case let literal: literal
        }
    }

    /// `HOST:PORT` as a URL authority (RFC 3986 §3.2.2): an IPv6 literal in brackets.
    public static func authority(_ host: String, port: UInt16) -> String {
        let literal = literal(host)
        return literal.contains(":") ? "[\(literal)]:\(port)" : "\(literal):\(port)"
    }
}
