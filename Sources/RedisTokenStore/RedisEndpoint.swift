/// Where the Redis server is and how to log in: the parsed form of `--redis-url`.
///
/// Accepted forms (docs/replicas.md):
/// - `redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]`: port 6379 and database 0 by default, an IPv6
///   host in brackets, user and password percent-encoded (RFC 3986 section 2.1). With a user name
///   the service authenticates with `AUTH USER PASSWORD` (Redis 6 ACLs), without one with
///   `AUTH PASSWORD`.
/// - `rediss://[[USER]:PASSWORD@]HOST[:PORT][/DB]`: the same over TLS (port 6379 by default, as
///   with `redis://`); the server's certificate is always verified against the host.
/// - `redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER_NAME[/DB]` and
///   `rediss+sentinel://...` (TLS to the sentinels and the master): the master named
///   `MASTER_NAME` as the sentinels report it (port 26379 by default for a sentinel); USER and
///   PASSWORD authenticate to the master.
/// - `unix:///PATH/TO/SOCKET[?db=N]`: a Unix domain socket, database 0 by default.
///
/// The description of an endpoint never contains the password.
///
/// Thread-safety: a value type, `Sendable`.
public struct RedisEndpoint: Sendable, Equatable, CustomStringConvertible {
    /// How to reach the server.
    public enum Address: Sendable, Equatable {
        /// A host name or IP address (without brackets) and a TCP port.
        case tcp(host: String, port: Int)
        /// The path of a Unix domain socket.
        case unix(path: String)
    }

    /// How to reach the server.
    public var address: Address
    /// The Redis 6 ACL user name, or `nil` for the default user.
    public var user: String?
    /// The password as bytes (it may hold any byte once percent-decoded), or `nil` for none.
    public var password: [UInt8]?
    /// The logical database selected with `SELECT` (0 by default).
    public var database: Int
    /// Whether the connection uses TLS (`rediss://`, `rediss+sentinel://`; TCP only).
    public var tls: Bool
    /// With a `redis+sentinel://` or `rediss+sentinel://` URL, the sentinels that name the master
    /// (then `address` is where the master was last found, the first sentinel at first); `nil`
    /// otherwise.
    public var sentinel: Sentinel?

    /// A host name or IP address (without brackets) and a TCP port.
    public struct Host: Sendable, Hashable, CustomStringConvertible {
        /// The name or address.
        public var host: String
        /// The port.
        public var port: Int
        /// Creates a host.
        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }
        /// `HOST:PORT` (`[V6]:PORT`).
        public var description: String { (host.contains(":") ? "[\(host)]" : host) + ":\(port)" }
    }

    /// The sentinels of a sentinel URL (Redis Sentinel documentation, "Sentinel clients
    /// implementation guidelines").
    public struct Sentinel: Sendable, Equatable {
        /// The sentinels, in the URL's order (port 26379 by default); at least one.
        public var hosts: [Host]
        /// The master's name as in `sentinel monitor`: 1 to 64 of `A-Z a-z 0-9 . _ -`.
        public var masterName: String
        /// The sentinels' own password (`requirepass` in sentinel.conf), or `nil` for none.
        public var password: [UInt8]?
        /// Creates the sentinels of a URL.
        public init(hosts: [Host], masterName: String, password: [UInt8]? = nil) {
            self.hosts = hosts
            self.masterName = masterName
            self.password = password
        }
    }

    /// Creates an endpoint from its parts.
    public init(address: Address, user: String? = nil, password: [UInt8]? = nil, database: Int = 0, tls: Bool = false) {
        self.address = address
        self.user = user
        self.password = password
        self.database = database
        self.tls = tls
    }

    /// Why a URL was refused. The messages never contain the password (nor the URL, which may).
    public enum ParseError: Error, Equatable, CustomStringConvertible {
        /// A scheme other than `redis` or `unix`.
        case unknownScheme(String)
        /// The URL is malformed; the string says which part.
        case malformed(String)

        /// One sentence for an exit message (the caller prefixes the flag or variable).
        public var description: String {
            switch self {
            case .unknownScheme(let scheme):
                return
                    "unknown scheme \"\(scheme)\" (expected redis://, rediss://, redis+sentinel://, rediss+sentinel:// or unix://)"
            case .malformed(let why):
                return "malformed URL: \(why)"
            }
        }
    }

    /// The endpoint without its password, for log lines: `redis://HOST:PORT/DB` (`rediss://` with
    /// TLS, with `USER@` when there is a user) or `unix:///PATH?db=N`.
    public var description: String {
        if let sentinel {
            let userPart = user.map { "\($0)@" } ?? ""
            let hosts = sentinel.hosts.map(\.description).joined(separator: ",")
            return "\(tls ? "rediss" : "redis")+sentinel://\(userPart)\(hosts)/\(sentinel.masterName)/\(database)"
        }
        switch address {
        case .tcp(let host, let port):
            let shownHost = host.contains(":") ? "[\(host)]" : host
            let userPart = user.map { "\($0)@" } ?? ""
            return "\(tls ? "rediss" : "redis")://\(userPart)\(shownHost):\(port)/\(database)"
        case .unix(let path):
            return "unix://\(path)?db=\(database)"
        }
    }

    /// Parses `text` as a Redis URL.
    /// - Throws: `ParseError` saying what is wrong, never echoing the URL.
    public static func parse(_ text: String) throws(ParseError) -> RedisEndpoint {
        guard let colon = text.firstIndex(of: ":"), text[colon...].hasPrefix("://") else {
            throw .malformed(
                "expected redis://HOST[:PORT][/DB], rediss://..., redis+sentinel://HOST[:PORT],.../MASTER[/DB] or unix:///PATH"
            )
        }
        let scheme = text[..<colon].lowercased()
        let rest = String(text[text.index(colon, offsetBy: 3)...])
        switch scheme {
        case "redis": return try parseTCP(rest)
        case "unix": return try parseUnix(rest)
        case "rediss", "redis+sentinel", "rediss+sentinel":
            var endpoint = try parseTCP(rest, sentinel: scheme.hasSuffix("+sentinel"))
            endpoint.tls = scheme.hasPrefix("rediss")
            return endpoint
        default:
            // Only letters, digits, '+', '-', '.' are shown, so that nothing secret leaks.
            let shown = scheme.filter { $0.isASCII && ($0.isLetter || $0.isNumber || "+-.".contains($0)) }
            throw .unknownScheme(String(shown.prefix(16)))
        }
    }

    private static func parseTCP(_ rest: String, sentinel: Bool = false) throws(ParseError) -> RedisEndpoint {
        if rest.contains("?") || rest.contains("#") {
            throw .malformed("a Redis URL with a host takes no query or fragment")
        }
        let authority: Substring
        var path: Substring
        if let slash = rest.firstIndex(of: "/") {
            authority = rest[..<slash]
            path = rest[rest.index(after: slash)...]
        } else {
            authority = Substring(rest)
            path = ""
        }
        var user: String?
        var password: [UInt8]?
        var hostPort = authority
        if let at = authority.lastIndex(of: "@") {
            let userInfo = authority[..<at]
            hostPort = authority[authority.index(after: at)...]
            guard let colon = userInfo.firstIndex(of: ":") else {
                throw .malformed("the credentials must be USER:PASSWORD or :PASSWORD before '@'")
            }
            let userBytes = try percentDecode(userInfo[..<colon], part: "user name")
            let passwordBytes = try percentDecode(userInfo[userInfo.index(after: colon)...], part: "password")
            if !userBytes.isEmpty {
                guard let name = String(validating: userBytes, as: UTF8.self),
                    !name.contains(where: { $0 == " " || $0.asciiValue.map { $0 < 0x20 || $0 == 0x7F } ?? false })
                else {
                    throw .malformed("the user name must be UTF-8 without spaces or control characters")
                }
                user = name
            }
            if !passwordBytes.isEmpty { password = passwordBytes }
            if user != nil && password == nil {
                throw .malformed("a user name needs a password (USER:PASSWORD@)")
            }
        }
        var sentinels: Sentinel?
        let address: Address
        if sentinel {
            var hosts: [Host] = []
            for part in hostPort.split(separator: ",", omittingEmptySubsequences: false) {
                hosts.append(try parseHostPort(part, defaultPort: 26379))
            }
            let name: Substring
            if let slash = path.firstIndex(of: "/") {
                name = path[..<slash]
                path = path[path.index(after: slash)...]
            } else {
                name = path
                path = ""
            }
            guard (1...64).contains(name.utf8.count),
                name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "." || $0 == "_" || $0 == "-") })
            else {
                throw .malformed("the master name (after the sentinels) must be 1 to 64 of A-Z a-z 0-9 . _ -")
            }
            sentinels = Sentinel(hosts: hosts, masterName: String(name))
            address = .tcp(host: hosts[0].host, port: hosts[0].port)
        } else {
            let host = try parseHostPort(hostPort, defaultPort: 6379)
            address = .tcp(host: host.host, port: host.port)
        }
        var database = 0
        if !path.isEmpty {
            guard let value = decimal(path, max: Int(Int32.max)) else {
                throw .malformed("the path must be a database number (/0, /1, ...)")
            }
            database = value
        }
        var endpoint = RedisEndpoint(address: address, user: user, password: password, database: database)
        endpoint.sentinel = sentinels
        return endpoint
    }

    /// `HOST[:PORT]`, with an IPv6 host in brackets.
    private static func parseHostPort(_ hostPort: Substring, defaultPort: Int) throws(ParseError) -> Host {
        var host: Substring
        var portText: Substring?
        if hostPort.hasPrefix("[") {
            guard let close = hostPort.firstIndex(of: "]") else {
                throw .malformed("an IPv6 host must end with ']'")
            }
            host = hostPort[hostPort.index(after: hostPort.startIndex)..<close]
            let after = hostPort[hostPort.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw .malformed("expected ':PORT' after the IPv6 host") }
                portText = after.dropFirst()
            }
            guard !host.isEmpty, host.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." }) else {
                throw .malformed("the IPv6 host in brackets is not an IPv6 address")
            }
        } else {
            if let colon = hostPort.firstIndex(of: ":") {
                host = hostPort[..<colon]
                portText = hostPort[hostPort.index(after: colon)...]
            } else {
                host = hostPort
            }
            guard host.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "." || $0 == "_") })
            else {
                throw .malformed("the host must be a name, an IPv4 address or an IPv6 address in brackets")
            }
        }
        guard !host.isEmpty else { throw .malformed("the host is missing") }
        var port = defaultPort
        if let portText {
            guard let value = decimal(portText, max: 65535), value >= 1 else {
                throw .malformed("the port must be a number from 1 to 65535")
            }
            port = value
        }
        return Host(host: String(host), port: port)
    }

    private static func parseUnix(_ rest: String) throws(ParseError) -> RedisEndpoint {
        var pathPart = Substring(rest)
        var database = 0
        if rest.contains("#") { throw .malformed("a unix:// URL takes no fragment") }
        if let question = rest.firstIndex(of: "?") {
            pathPart = rest[..<question]
            let query = rest[rest.index(after: question)...]
            guard query.hasPrefix("db="), let value = decimal(query.dropFirst(3), max: Int(Int32.max)) else {
                throw .malformed("the only query a unix:// URL takes is ?db=N")
            }
            database = value
        }
        guard pathPart.hasPrefix("/") else {
            throw .malformed("a unix:// URL needs an absolute socket path (unix:///path/to/socket)")
        }
        let bytes = try percentDecode(pathPart, part: "socket path")
        guard bytes.count > 1, !bytes.contains(0), let path = String(validating: bytes, as: UTF8.self) else {
            throw .malformed("the socket path must be a non-empty UTF-8 path")
        }
        guard bytes.count < 108 else { throw .malformed("the socket path is longer than 107 bytes") }
        return RedisEndpoint(address: .unix(path: path), database: database)
    }

    private static func decimal(_ text: Substring, max: Int) -> Int? {
        guard !text.isEmpty, text.count <= 10, text.allSatisfy({ $0.isASCII && $0.isNumber }),
            let value = Int(text), value <= max
        else { return nil }
        return value
    }

    /// Decodes `%XX` escapes (RFC 3986 section 2.1).
    static func percentDecode(_ text: Substring, part: String) throws(ParseError) -> [UInt8] {
        var out: [UInt8] = []
        var bytes = Array(text.utf8)[...]
        while let byte = bytes.popFirst() {
            guard byte == UInt8(ascii: "%") else {
                out.append(byte)
                continue
            }
            guard bytes.count >= 2,
                let high = hexValue(bytes[bytes.startIndex]),
                let low = hexValue(bytes[bytes.startIndex + 1])
            else {
                throw .malformed("a '%' in the \(part) must be followed by two hex digits")
            }
            out.append(high << 4 | low)
            bytes = bytes.dropFirst(2)
        }
        return out
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }
}

/// The namespace of the keys in Redis: `PREFIX:state`, `PREFIX:changes` and `PREFIX:probe`.
///
/// Thread-safety: a value type, `Sendable`.
public struct RedisKeyPrefix: Sendable, Equatable, CustomStringConvertible {
    /// The prefix itself: 1 to 64 of `[A-Za-z0-9:_.-]`.
    public let value: String

    /// The default prefix, `forge-push-token`.
    public static let standard = RedisKeyPrefix(unchecked: "forge-push-token")

    private init(unchecked value: String) { self.value = value }

    /// Validates `value`; `nil` when it is empty, longer than 64 characters or holds a character
    /// outside `[A-Za-z0-9:_.-]`.
    public init?(_ value: String) {
        guard (1...64).contains(value.utf8.count),
            value.utf8.allSatisfy({ byte in
                (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
                    || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
                    || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                    || byte == UInt8(ascii: ":") || byte == UInt8(ascii: "_")
                    || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "-")
            })
        else { return nil }
        self.value = value
    }

    /// `PREFIX:state`, the hash holding `version` and `token`.
    public var stateKey: String { value + ":state" }
    /// `PREFIX:changes`, the pub/sub channel of changes.
    public var changesChannel: String { value + ":changes" }
    /// `PREFIX:probe`, the pub/sub channel of the replicas' delivery probes.
    public var probeChannel: String { value + ":probe" }
    /// The prefix itself.
    public var description: String { value }
}
