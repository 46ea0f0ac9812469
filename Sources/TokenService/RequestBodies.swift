import ForgePushToken
import ForgePushTokenOwner
import HTTPServing
import ServerSupport

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Decoding of request bodies into the service's inputs (http-api.md, `POST /register` and
/// `POST /fail`). Pure functions over bytes; every rejection is a `ServiceError` whose message
/// says what to send instead.
public enum RequestBodies {
    /// The media type of a `Content-Type` value: the part before any `;`, trimmed, lowercased
    /// (RFC 9110 §8.3.1: parameters such as `charset` do not change it). `nil` for no header.
    public static func mediaType(_ contentType: String?) -> String? {
        guard let contentType else { return nil }
        if let ascii = asciiMediaType(contentType) { return ascii }
        let type = contentType.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
        return String(type.trimmingASCIIWhitespace()).lowercased()
    }

    /// The device token of a `POST /register` body as the service keeps it: lowercase hex, two
    /// digits per byte (`DeviceTokenHex`).
    ///
    /// - `application/octet-stream`: the raw bytes, 1 to 256.
    /// - `application/json`: `{"deviceToken":"<hex>"}`.
    /// - `multipart/form-data`: refused with a hint to use `-d` or `--data-binary`.
    /// - anything else or none: the hex text, or the form field `deviceToken=<hex>`.
    ///
    /// Hex text: ASCII whitespace at both ends is ignored; then 2 to 512 digits `[0-9a-fA-F]`,
    /// an even number of them. A body of plain hex text (the common case) becomes the text
    /// directly, lowered, without decoding it into bytes and encoding them again
    /// (`plainHexText`, which gives what the general path, `hexToken`, gives encoded: tested in
    /// RegisterBodyTests and fuzzed).
    /// - Throws: `ServiceError` with code `invalid_token`.
    public static func deviceTokenHex(contentType: String?, body: [UInt8]) throws(ServiceError) -> String {
        try decodeToken(
            contentType: contentType, body: body, plainHex: plainHexText, fromBytes: { DeviceTokenHex.encode($0) })
    }

    /// The decision behind `deviceTokenHex`: `plainHex` gives the result of
    /// a body of plain hex text (tried first wherever hex text is read), `fromBytes` the result of
    /// the token's bytes decoded any other way.
    private static func decodeToken<Token>(
        contentType: String?, body: [UInt8], plainHex: ([UInt8]) -> Token?, fromBytes: ([UInt8]) -> Token
    ) throws(ServiceError) -> Token {
        switch mediaType(contentType) {
        case "application/octet-stream":
            guard !body.isEmpty else { throw invalidToken("the body is empty; send the raw device token bytes") }
            guard body.count <= TokenState.maxTokenBytes else {
                throw invalidToken("a device token is 1 to \(TokenState.maxTokenBytes) bytes; got \(body.count)")
            }
            return fromBytes(body)
        case "application/json":
            guard let decoded = try? JSONDecoder().decode(RegisterJSON.self, from: Data(body)) else {
                throw invalidToken(#"expected a JSON object {"deviceToken":"<hex>"}"#)
            }
            return fromBytes(try hexToken(Substring(decoded.deviceToken)))
        case "multipart/form-data":
            throw invalidToken("multipart/form-data is not accepted; send the hex token with curl -d or --data-binary")
        default:
            if let token = plainHex(body) { return token }
            guard let text = String(validating: body, as: UTF8.self) else {
                throw invalidToken("the body is not UTF-8 text; send hex digits")
            }
            if text.contains("=") {
                guard let field = formField("deviceToken", in: text) else {
                    throw invalidToken("the form has no deviceToken field; send deviceToken=<hex> or the hex alone")
                }
                guard let value = percentDecoded(field) else {
                    throw invalidToken("the deviceToken field is not valid percent-encoded UTF-8")
                }
                return fromBytes(try hexToken(Substring(value)))
            }
            return fromBytes(try hexToken(Substring(text)))
        }
    }

    /// The JSON body of `POST /register`: `{"deviceToken":"<hex>"}`.
    private struct RegisterJSON: Decodable {
        let deviceToken: String
    }

    /// The error a `POST /fail` body describes.
    ///
    /// - `application/json`: an object with `"message"` (string, required), optional `"domain"`
    ///   (string) and `"code"` (integer), like an `NSError`; other members are ignored.
    /// - anything else: the body text (UTF-8) is the message.
    /// - An empty body, whatever its type, means "unknown error" (the body is optional).
    /// - Throws: `ServiceError` with code `invalid_request`.
    public static func registrationFailure(contentType: String?, body: [UInt8]) throws(ServiceError)
        -> RegistrationFailure
    {
        if body.isEmpty { return RegistrationFailure(message: "unknown error") }
        if mediaType(contentType) == "application/json" {
            guard let decoded = try? JSONDecoder().decode(RegistrationFailure.self, from: Data(body)) else {
                throw ServiceError(
                    "invalid_request",
                    #"expected a JSON object {"message":"…"} with optional "domain" (string) and "code" (integer)"#)
            }
            return decoded
        }
        guard let text = String(validating: body, as: UTF8.self) else {
            throw ServiceError("invalid_request", "the body is not valid UTF-8 text")
        }
        return RegistrationFailure(message: text)
    }

    /// `mediaType` for an all-ASCII value, over its bytes (the common case, without the
    /// `Character` machinery); `nil` when the value has a non-ASCII byte.
    static func asciiMediaType(_ contentType: String) -> String? {
        let result: String?? = contentType.utf8.withContiguousStorageIfAvailable { bytes -> String? in
            guard !bytes.contains(where: { $0 >= 0x80 }) else { return nil }
            var start = 0
            var end = bytes.firstIndex(of: UInt8(ascii: ";")) ?? bytes.count
            while start < end, isASCIISpace(bytes[start]) { start += 1 }
            while end > start, isASCIISpace(bytes[end - 1]) { end -= 1 }
            if start == 0, end == bytes.count,
                !bytes.contains(where: { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") })
            {
                return contentType  // already a bare, lowercase media type
            }
            return String(decoding: bytes[start..<end].map(asciiLower), as: UTF8.self)
        }
        return result ?? nil
    }

    /// The token of a body that is nothing but hex text (ASCII whitespace at both ends allowed), as
    /// the service keeps it (lowercase hex text), made straight from the body's digits; `nil` for
    /// anything else (non-ASCII, a form, bad hex, a bad length), which the general path then
    /// decodes or rejects with its message. For every body it accepts, the result is the one the
    /// general path (`hexToken`, then `DeviceTokenHex.encode`) gives.
    static func plainHexText(_ body: [UInt8]) -> String? {
        body.withUnsafeBufferPointer { bytes in
            plainHexRange(bytes).flatMap { DeviceTokenHex.lowercased(buffer: UnsafeBufferPointer(rebasing: bytes[$0])) }
        }
    }

    /// The body without ASCII whitespace at both ends, when what is left has a token's length in
    /// hex digits (2 to `2 * TokenState.maxTokenBytes`); `nil` otherwise.
    private static func plainHexRange(_ body: UnsafeBufferPointer<UInt8>) -> Range<Int>? {
        var start = 0
        var end = body.count
        while start < end, isASCIISpace(body[start]) { start += 1 }
        while end > start, isASCIISpace(body[end - 1]) { end -= 1 }
        guard (2...2 * TokenState.maxTokenBytes).contains(end - start) else { return nil }
        return start..<end
    }

    /// Whether `byte` is ASCII whitespace: space, tab, LF, FF or CR.
    @inline(__always)
    package static func isASCIISpace(_ byte: UInt8) -> Bool {
        byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D || byte == 0x0C
    }

    static func hexToken(_ text: Substring) throws(ServiceError) -> [UInt8] {
        let digits = text.trimmingASCIIWhitespace()
        guard !digits.isEmpty else { throw invalidToken("the body is empty; send the device token as hex digits") }
        guard digits.utf8.count <= 2 * TokenState.maxTokenBytes else {
            throw invalidToken(
                "a device token is 2 to \(2 * TokenState.maxTokenBytes) hex digits; got \(digits.utf8.count)")
        }
        guard digits.utf8.count % 2 == 0 else {
            throw invalidToken("a device token has an even number of hex digits; got \(digits.utf8.count)")
        }
        guard let bytes = DeviceTokenHex.decode(digits) else {
            throw invalidToken("a device token is hex digits 0-9 and a-f only")
        }
        return bytes
    }

    /// The first value of `name` in an `application/x-www-form-urlencoded` text, still
    /// percent-encoded (WHATWG URL standard), or `nil` when no field has that name.
    static func formField(_ name: String, in text: String) -> Substring? {
        for pair in text.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard percentDecoded(parts[0]) == name else { continue }
            return parts.count > 1 ? parts[1] : ""
        }
        return nil
    }

    /// `text` with `+` as a space and each `%XX` as the byte XX; `nil` when a `%` is not followed
    /// by two hex digits or the bytes are not UTF-8.
    static func percentDecoded(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var input = text.utf8.makeIterator()
        while let byte = input.next() {
            switch byte {
            case UInt8(ascii: "+"):
                bytes.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                guard let high = input.next(), let low = input.next(),
                    let decoded = DeviceTokenHex.decode(utf8: [high, low])
                else { return nil }
                bytes.append(contentsOf: decoded)
            default:
                bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    static func invalidToken(_ message: String) -> ServiceError {
        ServiceError("invalid_token", message)
    }
}

/// A registration failure reported through `POST /fail`, mirroring `NSError`'s domain, code and
/// localized description. Its `description` is what the responder logs (`registration failed: …`).
public struct RegistrationFailure: Error, Sendable, Equatable, Decodable, CustomStringConvertible {
    /// The human-readable message.
    public var message: String
    /// The error domain, for example `"NSCocoaErrorDomain"`.
    public var domain: String?
    /// The error code within its domain, for example `3010`.
    public var code: Int?

    /// Creates a failure.
    public init(message: String, domain: String? = nil, code: Int? = nil) {
        self.message = message
        self.domain = domain
        self.code = code
    }

    /// `message`, preceded by `domain code:` where given, for example
    /// `NSCocoaErrorDomain 3010: remote notifications are not supported in the simulator`.
    public var description: String {
        switch (domain, code) {
        case (let domain?, let code?): "\(domain) \(code): \(message)"
        case (let domain?, nil): "\(domain): \(message)"
        case (nil, let code?): "code \(code): \(message)"
        case (nil, nil): message
        }
    }
}

extension StringProtocol where UTF8View: BidirectionalCollection {
    /// The text without ASCII whitespace (`RequestBodies.isASCIISpace`: space, tab, LF, FF, CR)
    /// at both ends. Works on the UTF-8 bytes, so "\r\n" (one Character) is trimmed too.
    package func trimmingASCIIWhitespace() -> SubSequence {
        let bytes = utf8
        guard let first = bytes.firstIndex(where: { !RequestBodies.isASCIISpace($0) }),
            let last = bytes.lastIndex(where: { !RequestBodies.isASCIISpace($0) })
        else { return self[endIndex...] }
        return self[first..<bytes.index(after: last)]
    }
}
