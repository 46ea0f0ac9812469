/// Lowercase hexadecimal text for APNs device tokens.
///
/// A device token is an opaque, variable-length sequence of bytes (today usually 32, but Apple
/// documents no fixed length, so nothing here assumes one). Its text form is the bytes in their
/// original order, each written as two lowercase hex digits: a token of N bytes becomes exactly
/// 2N characters from `0123456789abcdef`.
///
/// The text is built digit by digit from each nibble, never from `Data.description` (whose format
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
    /// Contiguous bytes (an array, `Data`) are written straight into the new string's storage:
    /// one pass, one allocation; other sequences are copied into an array first.
    package static func encode<Bytes: Sequence>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        if let text = bytes.withContiguousStorageIfAvailable({ encode(buffer: $0) }) { return text }
        return Array(bytes).withUnsafeBufferPointer { encode(buffer: $0) }
    }

    /// ``encode(_:)`` over contiguous bytes; not generic, so it runs specialised from any caller.
    package static func encode(buffer bytes: UnsafeBufferPointer<UInt8>) -> String {
        String(unsafeUninitializedCapacity: 2 * bytes.count) { out in
            var index = 0
            for byte in bytes {
                out[index] = digit(byte >> 4)
                out[index + 1] = digit(byte & 0x0f)
                index += 2
            }
            return index
        }
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
        if let bytes = utf8.withContiguousStorageIfAvailable({ decode(buffer: $0) }) { return bytes }
        return Array(utf8).withUnsafeBufferPointer { decode(buffer: $0) }
    }

    /// ``decode(utf8:)`` over contiguous bytes; not generic, so it runs specialised from any caller.
    package static func decode(buffer utf8: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        let count = utf8.count
        guard count > 0, count % 2 == 0 else { return nil }
        var valid = true
        let bytes = [UInt8](unsafeUninitializedCapacity: count / 2) { out, initialized in
            var index = 0
            while index < count {
                guard let high = nibble(utf8[index]), let low = nibble(utf8[index + 1]) else {
                    valid = false
                    break
                }
                out[index / 2] = high << 4 | low
                index += 2
            }
            initialized = index / 2
        }
        return valid ? bytes : nil
    }

    /// The lowercase hex text of hex text: `text` (contiguous UTF-8) with `A`–`F` lowered, made
    /// in one pass straight into the string's storage; `nil` exactly when ``decode(buffer:)``
    /// gives `nil`. For every text it accepts, the result equals
    /// `encode(decode(buffer: text)!)`, without the bytes in between.
    ///
    /// Every byte is checked and lowered without a branch: setting bit 5 (`| 0x20`) lowers `A`–`F`
    /// and leaves the digits as they are (each of `0`–`9` has it set), and a byte is a hex digit
    /// exactly when it is `0`–`9` or its lowered form is `a`–`f` (only `A`–`F` and `a`–`f` lower
    /// to `a`–`f`). The service runs this on every `POST /register` body: a branch and two bounds
    /// checks per byte cost it about 1,000 instructions per 64-digit token, this loop a third.
    package static func lowercased(buffer utf8: UnsafeBufferPointer<UInt8>) -> String? {
        let count = utf8.count
        guard count > 0, count % 2 == 0, let source = utf8.baseAddress else { return nil }
        var invalid = false
        let text = String(unsafeUninitializedCapacity: count) { out in
            guard let target = out.baseAddress else { return 0 }
            // 1 once a byte was not a hex digit: arithmetic, not `||`, so that the loop has no
            // branch and the compiler may vectorize it.
            var notHex: UInt8 = 0
            for index in 0..<count {
                let codeUnit = source[index]
                let lowered = codeUnit | 0x20
                let isDigit: UInt8 = codeUnit &- UInt8(ascii: "0") < 10 ? 1 : 0
                let isLetter: UInt8 = lowered &- UInt8(ascii: "a") < 6 ? 1 : 0
                notHex |= (isDigit | isLetter) ^ 1
                target[index] = lowered
            }
            invalid = notHex != 0
            // Only ASCII was written when every byte was a hex digit; otherwise the text is
            // thrown away, and nothing at all is kept of it (no invalid UTF-8 is handed over).
            return invalid ? 0 : count
        }
        return invalid ? nil : text
    }

    /// The lowercase ASCII hex digit of `nibble` (0...15), computed rather than looked up.
    @inline(__always)
    private static func digit(_ nibble: UInt8) -> UInt8 {
        nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "a") - 10 + nibble
    }

    /// Whether `codeUnit` is one of the digits `encode` writes (`0`–`9`, `a`–`f`): the canonical
    /// form the service keeps a token in. Stateless; thread-safe.
    @inline(__always)
    package static func isLowercaseDigit(_ codeUnit: UInt8) -> Bool {
        (codeUnit &- UInt8(ascii: "0")) < 10 || (codeUnit &- UInt8(ascii: "a")) < 6
    }

    /// The value of one ASCII hex digit, or `nil` if `codeUnit` is not one.
    @inline(__always)
    private static func nibble(_ codeUnit: UInt8) -> UInt8? {
        switch codeUnit {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): codeUnit - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): codeUnit - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): codeUnit - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}
