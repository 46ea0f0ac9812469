import ForgePushTokenTestSupport
import Foundation
import Testing

@testable import ForgePushToken

/// Rule 1: a token of N bytes becomes exactly 2N characters `[0-9a-f]`, byte order kept, any N.
@Suite("Rule 1: hex encoding")
struct HexEncodingTests {
    @Test func encodesNibblesInByteOrder() {
        #expect(DeviceTokenHex.encode([0x00, 0x0f, 0xa0, 0xff]) == "000fa0ff")
        #expect(DeviceTokenHex.encode(Data([0x00, 0x0f, 0xa0, 0xff])) == "000fa0ff")
        #expect(DeviceTokenHex.encode([UInt8]()) == "")
    }

    @Test func goldenValueForA32ByteToken() {
        let bytes = (0..<32).map { UInt8($0 * 8 + 1) }
        #expect(
            DeviceTokenHex.encode(bytes)
                == "0109111921293139414951596169717981899199a1a9b1b9c1c9d1d9e1e9f1f9"
        )
    }

    @Test(arguments: [1, 32, 33, 100, 256])
    func nBytesBecomeTwoNLowercaseHexDigits(count: Int) {
        var generator = SeededGenerator(state: 0x5EED_0000 + UInt64(count))  // repeatable
        for _ in 0..<50 {
            let bytes = (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
            let text = DeviceTokenHex.encode(bytes)
            #expect(text.utf8.count == 2 * count)
            #expect(
                text.utf8.allSatisfy {
                    (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0)
                        || (UInt8(ascii: "a")...UInt8(ascii: "f")).contains($0)
                })
            #expect(DeviceTokenHex.decode(text) == bytes)
            #expect(DeviceTokenHex.decode(text.uppercased()) == bytes)
        }
    }

    @Test func everyByteValueRoundTrips() {
        let bytes = (0...255).map { UInt8($0) }
        let text = DeviceTokenHex.encode(bytes)
        #expect(text.hasPrefix("000102"))
        #expect(text.hasSuffix("fdfeff"))
        #expect(DeviceTokenHex.decode(text) == bytes)
        #expect(DeviceTokenHex.decode(text[...]) == bytes)
    }

    @Test func managerPublishesTheEncodingOfAHundredByteToken() {
        let bytes = (0..<100).map { UInt8(255 - $0) }
        let manager = PushTokenManager(logHandler: silent)
        manager.didRegister(deviceToken: Data(bytes))
        #expect(manager.token == DeviceTokenHex.encode(bytes))
        #expect(manager.token?.count == 200)
        #expect(manager.token?.hasPrefix("fffefd") == true)
    }

    @Test func decodeAcceptsMixedCase() {
        #expect(DeviceTokenHex.decode("0aF9") == [0x0a, 0xf9])
        #expect(DeviceTokenHex.decode("ABCDEF") == [0xab, 0xcd, 0xef])
    }

    @Test(arguments: ["", "a", "abc", "0g", "zz", " 00", "00 ", "0x00", "é0", "00\n", "+1", "ab:cd"])
    func decodeRejects(text: String) {
        #expect(DeviceTokenHex.decode(text) == nil)
    }

    @Test(arguments: ["", "a", "abc", "0g", "zz", " 00", "00 ", "0x00", "é0", "é", "00\n", "+1", "ab:cd"])
    func lowercasedRejectsWhatDecodeRejects(text: String) {
        #expect(DeviceTokenHex.decode(text) == nil)
        #expect(Array(text.utf8).withUnsafeBufferPointer { DeviceTokenHex.lowercased(buffer: $0) } == nil)
    }

    @Test("lowercased text equals encode(decode(text)) for every byte value, in any case")
    func lowercasedIsTheRoundTrip() {
        let bytes = (0...255).map { UInt8($0) }
        for text in [DeviceTokenHex.encode(bytes), DeviceTokenHex.encode(bytes).uppercased(), "0aF9", "Ab"] {
            let lowered = Array(text.utf8).withUnsafeBufferPointer { DeviceTokenHex.lowercased(buffer: $0) }
            #expect(lowered == DeviceTokenHex.decode(text).map { DeviceTokenHex.encode($0) })
            #expect(lowered == text.lowercased())
        }
    }

    @Test("lowercased accepts exactly the hex digits, at every position, of all 256 byte values")
    func lowercasedEveryByte() {
        let hex = Set("0123456789abcdefABCDEF".utf8)
        for byte in 0...255 {
            let codeUnit = UInt8(byte)
            for text in [[codeUnit, 0x30], [0x30, codeUnit], [0x61, 0x41, codeUnit, 0x46]] {
                let lowered = text.withUnsafeBufferPointer { DeviceTokenHex.lowercased(buffer: $0) }
                if hex.contains(codeUnit) {
                    #expect(lowered == String(decoding: text, as: UTF8.self).lowercased(), "\(text)")
                } else {
                    #expect(lowered == nil, "\(text)")
                }
            }
        }
    }

    @Test("a sequence without contiguous storage encodes like an array")
    func nonContiguousSequenceEncodes() {
        #expect(DeviceTokenHex.encode((0..<4).lazy.map { UInt8($0 * 0x41) }) == "004182c3")
        #expect(DeviceTokenHex.decode(utf8: "0aF9".utf8.lazy.map { $0 }) == [0x0a, 0xf9])
        #expect(DeviceTokenHex.decode(utf8: "0aG9".utf8.lazy.map { $0 }) == nil)
    }
}
