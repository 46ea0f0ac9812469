/// The header fields every response of the service carries, added in one place: the server engine
/// passes each response's fields through `completing(_:)` before it sends them (plain answers,
/// error answers, the cached `GET /token` answer and the event stream's head alike).
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

    /// `headers` followed by each of `defaults` whose name (ASCII case-insensitive) it lacks.
    public static func completing(_ headers: HTTPHeaders) -> HTTPHeaders {
        var completed = headers
        for field in defaults where headers[field.name] == nil {
            completed.add(field.name, field.value)
        }
        return completed
    }
}
