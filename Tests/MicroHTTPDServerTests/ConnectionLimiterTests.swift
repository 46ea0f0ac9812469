import ServerSupport
import Testing

@testable import MicroHTTPDServer

#if canImport(Glibc)
    import Glibc
#endif

/// `ConnectionLimiter` and `ClientAddress`: the bookkeeping behind `--max-connections` and
/// `--max-connections-per-ip`.
@Suite struct ConnectionLimiterTests {
    static let first = ClientAddress(high: 0, low: 0xFFFF_7F00_0001)  // 127.0.0.1
    static let second = ClientAddress(high: 0, low: 0xFFFF_7F00_0002)  // 127.0.0.2

    @Test func totalLimitRefusesOverItAndAdmitsAgainAfterARelease() {
        let limiter = ConnectionLimiter(maxTotal: 3, maxPerAddress: 0)
        for _ in 0..<3 { #expect(limiter.admit(Self.first) == .admitted) }
        #expect(limiter.admit(Self.second) == .refusedTotal)
        limiter.release(Self.first)
        #expect(limiter.admit(Self.second) == .admitted)
        #expect(limiter.admit(Self.second) == .refusedTotal, "three are open again")
    }

    @Test func perAddressLimitCountsEachAddressApart() {
        let limiter = ConnectionLimiter(maxTotal: 4, maxPerAddress: 2)
        #expect(limiter.admit(Self.first) == .admitted)
        #expect(limiter.admit(Self.first) == .admitted)
        #expect(limiter.admit(Self.first) == .refusedPerAddress)
        #expect(limiter.admit(Self.second) == .admitted)
        limiter.release(Self.first)
        #expect(limiter.admit(Self.first) == .admitted)
        for _ in 0..<2 { limiter.release(Self.first) }
        limiter.release(Self.second)
        // Every place is back: both limits start afresh.
        for address in [Self.first, Self.first, Self.second, Self.second] {
            #expect(limiter.admit(address) == .admitted)
        }
        #expect(limiter.admit(Self.first) == .refusedTotal)
    }

    @Test func unknownAddressesCountOnlyInTheTotal() {
        let limiter = ConnectionLimiter(maxTotal: 2, maxPerAddress: 1)
        #expect(limiter.admit(nil) == .admitted)
        #expect(limiter.admit(nil) == .admitted)
        #expect(limiter.admit(nil) == .refusedTotal)
        limiter.release(nil)
        limiter.release(nil)
        limiter.release(nil)  // more releases than admissions never go below zero
        #expect(limiter.admit(nil) == .admitted)
        #expect(limiter.admit(nil) == .admitted)
        #expect(limiter.admit(nil) == .refusedTotal, "a release below zero would have made room for a third")
    }

    @Test func concurrentAdmissionsNeverExceedTheLimit() async {
        let limiter = ConnectionLimiter(maxTotal: 50, maxPerAddress: 0)
        let admitted = await withTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask { (0..<100).filter { _ in limiter.admit(Self.first) == .admitted }.count }
            }
            return await group.reduce(0, +)
        }
        #expect(admitted == 50)
        #expect(limiter.admit(Self.second) == .refusedTotal, "all 50 places are taken")
    }

    @Test func ipv4AndItsMappedIPv6FormAreOneAddress() throws {
        var ipv4 = sockaddr_in()
        ipv4.sin_family = sa_family_t(AF_INET)
        inet_pton(AF_INET, "127.0.0.1", &ipv4.sin_addr)
        var ipv6 = sockaddr_in6()
        ipv6.sin6_family = sa_family_t(AF_INET6)
        inet_pton(AF_INET6, "::ffff:127.0.0.1", &ipv6.sin6_addr)
        var loopback6 = sockaddr_in6()
        loopback6.sin6_family = sa_family_t(AF_INET6)
        inet_pton(AF_INET6, "::1", &loopback6.sin6_addr)
        let a = withUnsafePointer(to: &ipv4) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { ClientAddress($0) }
        }
        let b = withUnsafePointer(to: &ipv6) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { ClientAddress($0) }
        }
        let c = withUnsafePointer(to: &loopback6) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { ClientAddress($0) }
        }
        #expect(a == Self.first)
        #expect(a == b)
        #expect(c == ClientAddress(high: 0, low: 1))
        // An AF_UNIX address: its family in the first bytes, as sockaddr lays it out.
        let unix = UnsafeMutableRawPointer.allocate(byteCount: 128, alignment: 8)
        defer { unix.deallocate() }
        unix.initializeMemory(as: UInt8.self, repeating: 0, count: 128)
        unix.storeBytes(of: sa_family_t(AF_UNIX), as: sa_family_t.self)
        #expect(ClientAddress(unix.assumingMemoryBound(to: sockaddr.self)) == nil)
    }
}
