import ServerSupport

/// The header fields every response of the service carries, added in one place: the server engine
/// passes each response's fields through `completing(_:crossOrigin:origin:)` before it sends them
/// (plain answers, error answers, the engine's own refusals, the cached `GET /token` answer and the
/// event stream's head alike). Neither the responder nor the engine adds these fields elsewhere.
///
/// - The CORS fields (`CrossOriginPolicy.decorating(_:origin:)`), when cross-origin reads are on:
///   `Vary: Origin` on every answer, and for a request from an allowed `Origin`
///   `Access-Control-Allow-Origin` and `Access-Control-Expose-Headers` (WHATWG Fetch, "CORS
///   protocol"). The request's `Origin` is kept with the request from its head on, so that the
///   engine's own answers (413, 414, 431, 408, framing refusals) carry them as the responder's do.
///
/// - `X-Content-Type-Options: nosniff` on every response (WHATWG Fetch, "X-Content-Type-Options"):
///   a browser never guesses a type other than the `Content-Type` sent (a JSON error body that
///   echoes request text can never be run as a script or rendered as HTML).
/// - `Cache-Control: no-store` unless the response names its own cache policy (RFC 9111 §5.2.2.5):
///   health answers, metrics, `OPTIONS` answers and every error answer are about this moment and
///   must not be kept by any cache. The responses meant to be kept and revalidated set their own:
///   `GET /token` and the live page `no-cache` (with an `ETag`), the event stream
///   `no-cache, no-transform`.
///
/// A stateless namespace; thread-safe.
public enum ResponseHeaders {
    /// The fields added to every response that does not carry a field of the same name, in order.
    public static let defaults: [(name: String, value: String)] = [
        (name: "X-Content-Type-Options", value: "nosniff"),
        (name: "Cache-Control", value: "no-store"),
    ]

    /// `headers`, then the CORS fields for a request from `origin` under `crossOrigin` (none when
    /// it is off, the default), then each of `defaults` whose name (ASCII case-insensitive) it
    /// lacks.
    /// - Parameters:
    ///   - crossOrigin: the service's CORS policy (`--cors-origin`).
    ///   - origin: the request's `Origin` field value, or `nil` when it had none (or is not known:
    ///     a request whose head never arrived).
    public static func completing(
        _ headers: HTTPHeaders, crossOrigin: CrossOriginPolicy = CrossOriginPolicy(), origin: String? = nil
    ) -> HTTPHeaders {
        var completed = HTTPHeaders()
        completed.reserveCapacity(headers.fields.count + defaults.count)
        forEachField(of: headers, crossOrigin: crossOrigin, origin: origin) { completed.add($0, $1) }
        return completed
    }

    /// Calls `body` with each field of `completing(headers, crossOrigin:origin:)`, name and value,
    /// in the same order, without making that array: how the engine hands every answer's fields
    /// to libmicrohttpd (a copy of the fields per response cost about 600 instructions of a
    /// `POST /register`; docs/performance.md, "What the hot paths avoid").
    public static func forEachField(
        of headers: HTTPHeaders, crossOrigin: CrossOriginPolicy = CrossOriginPolicy(), origin: String? = nil,
        _ body: (_ name: String, _ value: String) -> Void
    ) {
        let decorated = crossOrigin.isEnabled ? crossOrigin.decorating(headers, origin: origin) : headers
        for field in decorated.fields { body(field.name, field.value) }
        for field in defaults where decorated[field.name] == nil { body(field.name, field.value) }
    }
}
