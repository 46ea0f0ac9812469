import ServerSupport

/// SHA-256 (FIPS 180-4, §6.2), for the two digests this module needs: the `sha256-…` sources of
/// the live page's `Content-Security-Policy` (W3C CSP Level 3, "hash-source", computed from the
/// page's own text so that policy and page cannot drift) and the entity tag of `GET /token`
/// (`EntityTag.strong(digesting:)`).
///
/// Written here because nothing this module may use has one: Foundation on Linux has no digest
/// API (CryptoKit is Apple's only), swift-crypto is not reachable from this build, and this target
/// is pure Swift by design (only `MicroHTTPDServer` links C libraries). Checked against the FIPS
/// 180-4 example vectors and against `openssl dgst -sha256` in `SHA256Tests`.
///
/// Not for secrets: nothing here needs to be constant-time. A stateless namespace; thread-safe.
package enum SHA256 {
    /// The 32-byte digest of `message`.
    package static func digest(_ message: some Collection<UInt8>) -> [UInt8] {
        if let digest = message.withContiguousStorageIfAvailable({ digest(UnsafeRawBufferPointer($0)) }) {
            return digest
        }
        return Array(message).withUnsafeBytes { digest($0) }
    }

    /// The digest of the bytes of `message`: whole blocks straight from the buffer, then the
    /// padded tail (§5.1.1: a 1 bit, zeros, the length in bits as 64 bits big-endian) from a
    /// 128-byte scratch block. No allocation but the result.
    private static func digest(_ message: UnsafeRawBufferPointer) -> [UInt8] {
        var state: (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32) = (
            0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a, 0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19
        )
        withUnsafeTemporaryAllocation(of: UInt32.self, capacity: 64) { schedule in
            let count = message.count
            var offset = 0
            while count - offset >= 64 {
                compress(&state, UnsafeRawBufferPointer(rebasing: message[offset..<(offset + 64)]), schedule)
                offset += 64
            }
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 128) { tail in
                tail.initialize(repeating: 0)
                let rest = count - offset
                for index in 0..<rest { tail[index] = message[offset + index] }
                tail[rest] = 0x80
                let blocks = rest + 9 <= 64 ? 1 : 2
                let bitLength = UInt64(count) &* 8
                for index in 0..<8 {
                    tail[blocks * 64 - 1 - index] = UInt8(truncatingIfNeeded: bitLength >> (8 * UInt64(index)))
                }
                let bytes = UnsafeRawBufferPointer(tail)
                for block in 0..<blocks {
                    compress(
                        &state, UnsafeRawBufferPointer(rebasing: bytes[(block * 64)..<(block * 64 + 64)]), schedule)
                }
            }
        }
        var digest = [UInt8]()
        digest.reserveCapacity(32)
        for word in [state.0, state.1, state.2, state.3, state.4, state.5, state.6, state.7] {
            digest.append(UInt8(truncatingIfNeeded: word >> 24))
            digest.append(UInt8(truncatingIfNeeded: word >> 16))
            digest.append(UInt8(truncatingIfNeeded: word >> 8))
            digest.append(UInt8(truncatingIfNeeded: word))
        }
        return digest
    }

    /// The round constants `K` (§4.2.2).
    private static let roundConstants: [UInt32] = [
        0x428a_2f98, 0x7137_4491, 0xb5c0_fbcf, 0xe9b5_dba5, 0x3956_c25b, 0x59f1_11f1, 0x923f_82a4, 0xab1c_5ed5,
        0xd807_aa98, 0x1283_5b01, 0x2431_85be, 0x550c_7dc3, 0x72be_5d74, 0x80de_b1fe, 0x9bdc_06a7, 0xc19b_f174,
        0xe49b_69c1, 0xefbe_4786, 0x0fc1_9dc6, 0x240c_a1cc, 0x2de9_2c6f, 0x4a74_84aa, 0x5cb0_a9dc, 0x76f9_88da,
        0x983e_5152, 0xa831_c66d, 0xb003_27c8, 0xbf59_7fc7, 0xc6e0_0bf3, 0xd5a7_9147, 0x06ca_6351, 0x1429_2967,
        0x27b7_0a85, 0x2e1b_2138, 0x4d2c_6dfc, 0x5338_0d13, 0x650a_7354, 0x766a_0abb, 0x81c2_c92e, 0x9272_2c85,
        0xa2bf_e8a1, 0xa81a_664b, 0xc24b_8b70, 0xc76c_51a3, 0xd192_e819, 0xd699_0624, 0xf40e_3585, 0x106a_a070,
        0x19a4_c116, 0x1e37_6c08, 0x2748_774c, 0x34b0_bcb5, 0x391c_0cb3, 0x4ed8_aa4a, 0x5b9c_ca4f, 0x682e_6ff3,
        0x748f_82ee, 0x78a5_636f, 0x84c8_7814, 0x8cc7_0208, 0x90be_fffa, 0xa450_6ceb, 0xbef9_a3f7, 0xc671_78f2,
    ]

    @inline(__always)
    private static func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 { (x >> n) | (x << (32 - n)) }

    /// One block of 64 bytes into `state` (§6.2.2), with `schedule` (64 words) as scratch.
    private static func compress(
        _ state: inout (UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32, UInt32),
        _ block: UnsafeRawBufferPointer, _ schedule: UnsafeMutableBufferPointer<UInt32>
    ) {
        for t in 0..<16 {
            schedule[t] =
                UInt32(block[4 * t]) << 24 | UInt32(block[4 * t + 1]) << 16 | UInt32(block[4 * t + 2]) << 8
                | UInt32(block[4 * t + 3])
        }
        for t in 16..<64 {
            let s0 = rotr(schedule[t - 15], 7) ^ rotr(schedule[t - 15], 18) ^ (schedule[t - 15] >> 3)
            let s1 = rotr(schedule[t - 2], 17) ^ rotr(schedule[t - 2], 19) ^ (schedule[t - 2] >> 10)
            schedule[t] = schedule[t - 16] &+ s0 &+ schedule[t - 7] &+ s1
        }
        var (a, b, c, d, e, f, g, h) = state
        roundConstants.withUnsafeBufferPointer { k in
            for t in 0..<64 {
                let t1 = h &+ (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) &+ ((e & f) ^ (~e & g)) &+ k[t] &+ schedule[t]
                let t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) &+ ((a & b) ^ (a & c) ^ (b & c))
                h = g
                g = f
                f = e
                e = d &+ t1
                d = c
                c = b
                b = a
                a = t1 &+ t2
            }
        }
        state = (
            state.0 &+ a, state.1 &+ b, state.2 &+ c, state.3 &+ d,
            state.4 &+ e, state.5 &+ f, state.6 &+ g, state.7 &+ h
        )
    }
}
