/// Lowercase hexadecimal text for APNs device tokens.
///
/// A device token is an opaque, variable-length sequence of bytes (today usually 32, but Apple
/// documents no fixed length, so nothing here assumes one). Its text form is the bytes in their
/// original order, each written as two lowercase hex digits: a token of N bytes becomes exactly
/// 2N characters from `0123456789abcdef`.
///
/// The text is built from a 16-entry lookup table, never from `Data.description` (whose format
/// changed in iOS 13 and broke apps that parsed it) and never from `String(format:)` (slow, and
/// locale- and Foundation-dependent).
///
/// `package` access: other targets of this package (the HTTP layer) use it; apps do not see it.
package enum DeviceTokenHex {
    /// The ASCII codes of `0`–`9` and `a`–`f`, indexed by nibble value.
    package static let digits: [UInt8] = Array("0123456789abcdef".utf8)

    /// Encodes bytes as lowercase hexadecimal text.
    ///
    /// - Parameter bytes: Any number of bytes, including none.
    /// - Returns: Exactly `2 * n` characters from `[0-9a-f]` for `n` input bytes, most
    ///   significant nibble of each byte first, byte order kept: `[0x00, 0x0f, 0xa0, 0xff]`
    ///   becomes `"000fa0ff"`. No bytes give the empty string.
    ///
    /// The UTF-8 code units are written into one buffer and the `String` is created once.
    package static func encode<Bytes: Sequence>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        var utf8: [UInt8] = []
        utf8.reserveCapacity(2 * bytes.underestimatedCount)
        for byte in bytes {
            utf8.append(digits[Int(byte >> 4)])
            utf8.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: utf8, as: UTF8.self)
    }

    /// Decodes hexadecimal text into bytes.
    ///
    /// - Parameter text: Hex digits `[0-9a-fA-F]` only, an even number of them, at least two.
    ///   Nothing else is accepted: no whitespace, no `0x` prefix, no separators. Callers trim and
    ///   bound the length themselves.
    /// - Returns: `text.utf8.count / 2` bytes, the first two digits giving the first byte; or
    ///   `nil` if `text` is empty, has an odd number of characters, or contains anything that is
    ///   not a hex digit.
    package static func decode<Text: StringProtocol>(_ text: Text) -> [UInt8]? {
        decode(utf8: text.utf8)
    }

    /// ``decode(_:)`` over the UTF-8 bytes of the text, for callers that hold bytes (a request
    /// body) and need no `String`.
    package static func decode<UTF8Bytes: Collection>(utf8: UTF8Bytes) -> [UInt8]? where UTF8Bytes.Element == UInt8 {
        let count = utf8.count
        guard count > 0, count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count / 2)
        var high: UInt8?
        for codeUnit in utf8 {
            guard let nibble = nibble(codeUnit) else { return nil }
            if let pending = high {
                bytes.append(pending << 4 | nibble)
                high = nil
            } else {
                high = nibble
            }
        }
        return bytes
    }

    /// The value of one ASCII hex digit, or `nil` if `codeUnit` is not one.
    private static func nibble(_ codeUnit: UInt8) -> UInt8? {
        switch codeUnit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): codeUnit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): codeUnit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): codeUnit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
