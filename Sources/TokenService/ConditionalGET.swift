import ForgePushTokenOwner
import HTTPServing
import ServerSupport

/// Conditional `GET` and `HEAD` (RFC 9110 §13): a client that sends back the `ETag` it holds in
/// `If-None-Match` gets `304 Not Modified` and no body while the representation is unchanged.
///
/// A stateless namespace; thread-safe.
public enum ConditionalGET {
    /// `full` when `ifNoneMatch` (the request's `If-None-Match` field value, or `nil`) does not
    /// match `current` (see `IfNoneMatch.matches(_:current:)`), else `notModified(full)`.
    public static func answer(_ full: HTTPResponse, current: EntityTag, ifNoneMatch: String?) -> HTTPResponse {
        IfNoneMatch.matches(ifNoneMatch, current: current) ? notModified(full) : full
    }

    /// The `304 Not Modified` that stands for `full` (RFC 9110 §15.4.5): the same header fields
    /// (`ETag`, `Cache-Control`, `Vary` and the rest, which a cache uses to update what it
    /// stored) except `Content-Type`.
    ///
    /// It keeps `full`'s body, which is never sent (a 304 has no content, and the engine sends
    /// none, as for `HEAD`), because libmicrohttpd writes the body's length as the 304's
    /// `Content-Length`: the 200's length is the one value RFC 9110 §8.6 allows there (an empty
    /// body would claim `Content-Length: 0`, which would be wrong).
    public static func notModified(_ full: HTTPResponse) -> HTTPResponse {
        HTTPResponse(
            status: 304,
            headers: HTTPHeaders(full.headers.fields.filter { !$0.name.caseInsensitiveEquals("Content-Type") }),
            body: full.body)
    }
}

extension Responder {
    /// The answer to `GET /token` at `snapshot`: 200, its pre-rendered body, `ETag` (the strong
    /// validator of the body, `TokenSnapshot.entityTag`) and `Cache-Control: no-cache` (caches
    /// may keep it but must revalidate it on every use; `private, no-cache` when `isPrivate`, for
    /// a token that needs the bearer token to read, so that no shared cache keeps it). The engine
    /// may build it once per version and reuse it for every request.
    public static func tokenResponse(_ snapshot: TokenSnapshot, isPrivate: Bool = false) -> HTTPResponse {
        .json(
            200, snapshot.tokenBody,
            headers: [
                "Cache-Control": isPrivate ? "private, no-cache" : "no-cache",
                "ETag": snapshot.entityTag.fieldValue,
            ])
    }

    /// The `304 Not Modified` of `tokenResponse(snapshot, isPrivate:)`, for a request whose
    /// `If-None-Match` matches `snapshot.entityTag`. The engine may build it once per version too.
    public static func tokenNotModified(_ snapshot: TokenSnapshot, isPrivate: Bool = false) -> HTTPResponse {
        ConditionalGET.notModified(tokenResponse(snapshot, isPrivate: isPrivate))
    }

    /// `GET` or `HEAD /token`: the current token, or 304 when the request's `If-None-Match` names
    /// it.
    func answerTokenRequest(_ request: HTTPRequest) -> HTTPResponse {
        let snapshot = owner.current
        let isPrivate = access.readsNeedToken
        return ConditionalGET.answer(
            Self.tokenResponse(snapshot, isPrivate: isPrivate), current: snapshot.entityTag,
            ifNoneMatch: request.headers["If-None-Match"])
    }

    /// `GET` or `HEAD /`: the live page with its policy header fields, or 304 when the request's
    /// `If-None-Match` names it.
    func pageRead(_ request: HTTPRequest) -> HTTPResponse {
        let full = HTTPResponse(
            status: 200, headers: LivePage.headers(isPrivate: access.readsNeedToken),
            body: LivePage.html)
        return ConditionalGET.answer(full, current: LivePage.entityTag, ifNoneMatch: request.headers["If-None-Match"])
    }
}
