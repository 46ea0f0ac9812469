import ForgePushToken

/// The service's one JSON string escaper, written by hand for the bodies on the hot paths
/// (`GET /token`, `POST /register`, the SSE event), where `JSONEncoder` cost more than the rest of
/// the request, and used by the JSON log lines too (`JSONLine.string`). For these values the output
/// is the bytes `JSONBody.encode` gives (sorted keys, no escaped slashes).
///
/// RFC 8259 §7: quote, backslash and C0 controls are escaped. U+2028 LINE SEPARATOR and U+2029
/// PARAGRAPH SEPARATOR are valid raw in JSON, but are escaped too (`\u2028`, `\u2029`; the same
/// value to any JSON parser): JavaScript before ES2019 ends a string literal there, and tools that
/// split text on Unicode line breaks (Python's `str.splitlines`, some log shippers) would cut a
/// body, an SSE `data:` line or a log line in two. Thread-safety: stateless.
package enum JSONText {
    /// Appends `value` as a JSON string, or `null` for `nil`.
    package static func append(_ value: String?, to out: inout [UInt8]) {
        guard let value else {
            out.append(contentsOf: "null".utf8)
            return
        }
        out.append(UInt8(ascii: "\""))
        let utf8 = value.utf8
        // Nothing to escape (hex digits, always, for a token): the bytes are copied as they are,
        // from the string's contiguous storage when it has one (native and small strings: always
        // here) with one `memcpy`, which costs a fraction of appending the view byte by byte.
        let plain: Bool
        if let copied = utf8.withContiguousStorageIfAvailable({ bytes -> Bool in
            guard !anyNeedsEscaping(UnsafeRawBufferPointer(bytes)) else { return false }
            out.append(contentsOf: bytes)
            return true
        }) {
            plain = copied
        } else if !utf8.contains(where: needsEscaping) {
            out.append(contentsOf: utf8)
            plain = true
        } else {
            plain = false
        }
        if plain {
            out.append(UInt8(ascii: "\""))
            return
        }
        var index = utf8.startIndex
        while index != utf8.endIndex {
            let byte = utf8[index]
            utf8.formIndex(after: &index)
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                out.append(UInt8(ascii: "\\"))
                out.append(byte)
            case 0x0A: out.append(contentsOf: #"\n"#.utf8)
            case 0x0D: out.append(contentsOf: #"\r"#.utf8)
            case 0x09: out.append(contentsOf: #"\t"#.utf8)
            case 0x08: out.append(contentsOf: #"\b"#.utf8)
            case 0x0C: out.append(contentsOf: #"\f"#.utf8)
            case 0..<0x20:
                out.append(contentsOf: #"\u00"#.utf8)
                out.append(DeviceTokenHex.digits[Int(byte >> 4)])
                out.append(DeviceTokenHex.digits[Int(byte & 0x0f)])
            case 0xE2:
                // A String's UTF-8 is valid: a lead byte 0xE2 has two continuation bytes.
                let second = utf8[index]
                let third = utf8[utf8.index(after: index)]
                if second == 0x80 && (third == 0xA8 || third == 0xA9) {
                    out.append(contentsOf: (third == 0xA8 ? #"\u2028"# : #"\u2029"#).utf8)
                    utf8.formIndex(&index, offsetBy: 2)
                } else {
                    out.append(byte)
                }
            default:
                out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// Whether JSON text must escape `byte` in a string (`JSONText.append`): quote, backslash, C0
/// controls, and 0xE2, which leads the UTF-8 of U+2028 and U+2029 (E2 80 A8, E2 80 A9).
@inline(__always)
package func needsEscaping(_ byte: UInt8) -> Bool {
    byte < 0x20 || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") || byte == 0xE2
}

/// Whether any byte of `bytes` `needsEscaping`, eight bytes at a time: the "has a byte less than
/// n" and "has a zero byte" tests of Bit Twiddling Hacks (Sean Eron Anderson, Stanford), exact as
/// answers to "any" for n at most 128, on each 8-byte word, then the tail byte by byte. A 64-digit
/// device token is eight words, where the byte-wise scan took about ten instructions a byte on
/// every `POST /register`.
package func anyNeedsEscaping(_ bytes: UnsafeRawBufferPointer) -> Bool {
    let ones: UInt64 = 0x0101_0101_0101_0101
    let highs: UInt64 = 0x8080_8080_8080_8080
    // Each term's high bit is set in a byte that is what it looks for (or above one that is):
    // below 0x20, a quote, a backslash, 0xE2 (a zero byte once XORed with it). One branch a word.
    @inline(__always) func zeroBytes(_ word: UInt64) -> UInt64 { (word &- ones) & ~word }
    var offset = 0
    while offset + 8 <= bytes.count {
        let word = bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
        let found =
            (word &- ones &* 0x20) & ~word | zeroBytes(word ^ (ones &* 0x22))
            | zeroBytes(word ^ (ones &* 0x5C)) | zeroBytes(word ^ (ones &* 0xE2))
        if found & highs != 0 { return true }
        offset += 8
    }
    while offset < bytes.count {
        if needsEscaping(bytes[offset]) { return true }
        offset += 1
    }
    return false
}
