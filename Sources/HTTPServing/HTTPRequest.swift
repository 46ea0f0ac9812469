import ServerSupport

/// One HTTP/1.1 request as the responder sees it: already parsed by the server engine
/// (libmicrohttpd), body complete.
///
/// A value type; `Sendable`. Semantics follow RFC 9110: the method is case-sensitive, header
/// field names are case-insensitive.
public struct HTTPRequest: Sendable {
    /// The request method as sent, for example `"GET"` (RFC 9110 §9: case-sensitive).
    public var method: String
    /// The path of the request target without the query, for example `"/token"`.
    public var path: String
    /// The query without its `?` (`"x=1"` for `/token?x=1`), or `nil` when there was none.
    public var query: String?
    /// The header fields in the order received.
    public var headers: HTTPHeaders
    /// The request body, decoded from any transfer coding; empty when there was none.
    public var body: [UInt8]

    /// Creates a request from a path and query already split apart, as a server engine that
    /// parses the request target hands them over (the path percent-decoded: a `?` in it is data,
    /// not the start of a query, so `/token%3Fx` is the path `/token?x`, which names no route).
    public init(method: String, path: String, query: String?, headers: HTTPHeaders = HTTPHeaders(), body: [UInt8] = [])
    {
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
    }

    /// Creates a request. `target` is the request target as sent (path and optional query);
    /// it is split at the first `?`. A query string never changes routing.
    public init(method: String, target: String, headers: HTTPHeaders = HTTPHeaders(), body: [UInt8] = []) {
        self.method = method
        // Split on the UTF-8 bytes, not on Characters: a "?" followed by a combining mark is one
        // Character, which a Character search would not find.
        let bytes = target.utf8
        if let mark = bytes.firstIndex(of: UInt8(ascii: "?")) {
            self.path = String(Substring(bytes[..<mark]))
            self.query = String(Substring(bytes[bytes.index(after: mark)...]))
        } else {
            self.path = target
            self.query = nil
        }
        self.headers = headers
        self.body = body
    }
}

/// HTTP header fields: an ordered list of name-value pairs with case-insensitive lookup by
/// name (RFC 9110 §5.1). Cheap for the handful of fields a request or response carries.
///
/// A value type; `Sendable`.
public struct HTTPHeaders: Sendable, ExpressibleByDictionaryLiteral, Sequence {
    /// The fields in order; names as given.
    public private(set) var fields: [(name: String, value: String)]

    /// Creates header fields from name-value pairs, in order.
    public init(_ fields: [(name: String, value: String)] = []) {
        self.fields = fields
    }

    /// Creates header fields from a literal, in order.
    public init(dictionaryLiteral elements: (String, String)...) {
        self.fields = elements.map { (name: $0.0, value: $0.1) }
    }

    /// The value of the first field named `name` (ASCII case-insensitive), or `nil`.
    public subscript(name: String) -> String? {
        fields.first { $0.name.caseInsensitiveEquals(name) }?.value
    }

    /// Makes room for `capacity` fields in all, so that appending up to that many allocates no more.
    public mutating func reserveCapacity(_ capacity: Int) {
        fields.reserveCapacity(capacity)
    }

    /// Appends a field; existing fields of the same name stay.
    public mutating func add(_ name: String, _ value: String) {
        fields.append((name: name, value: value))
    }

    /// Iterates the fields in order.
    public func makeIterator() -> IndexingIterator<[(name: String, value: String)]> {
        fields.makeIterator()
    }
}

extension StringProtocol {
    /// ASCII case-insensitive equality, as header names and media types need (RFC 9110 §5.1, §8.3.1).
    package func caseInsensitiveEquals(_ other: some StringProtocol) -> Bool {
        let lhs = utf8
        let rhs = other.utf8
        guard lhs.count == rhs.count else { return false }
        // Over contiguous UTF-8 (native strings, small ones included) a plain loop: the lookups of
        // every request and response come here, and `zip` cost ~600 instructions a lookup.
        let contiguous = lhs.withContiguousStorageIfAvailable { lhs in
            rhs.withContiguousStorageIfAvailable { rhs in
                for index in lhs.indices where asciiLower(lhs[index]) != asciiLower(rhs[index]) { return false }
                return true
            }
        }
        if let contiguous, let equal = contiguous { return equal }
        return zip(lhs, rhs).allSatisfy { asciiLower($0) == asciiLower($1) }
    }
}

/// `byte` with an ASCII capital letter made small, any other byte as it is (the case folding of
/// RFC 9110 §5.1's case-insensitive field names). Inlined across modules.
@inlinable @inline(__always)
public func asciiLower(_ byte: UInt8) -> UInt8 {
    (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z")) ? byte | 0x20 : byte
}
