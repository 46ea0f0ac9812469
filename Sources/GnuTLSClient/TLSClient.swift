import CGnuTLS

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// Why TLS could not be set up or failed: one phrase for a log line or an exit message, never
/// holding key material.
///
/// Thread-safety: a value type, `Sendable`.
public struct TLSError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What failed, in words (for example "certificate CN=redis signed by an unknown authority").
    public let description: String
    /// Whether the socket under the session failed (a reset or a broken pipe), not TLS itself.
    public let isSocketError: Bool

    /// An error saying `description`.
    public init(_ description: String, isSocketError: Bool = false) {
        self.description = description
        self.isSocketError = isSocketError
    }

    /// GnuTLS' own wording of error code `code` (`gnutls_strerror`).
    static func gnutls(_ code: Int32, _ what: String) -> TLSError {
        TLSError(
            "\(what): \(String(cString: gnutls_strerror(code)))",
            isSocketError: code == GNUTLS_E_PUSH_ERROR || code == GNUTLS_E_PULL_ERROR)
    }
}

/// The certificates a TLS client trusts and presents: the CA certificates that may sign the
/// server's certificate (a PEM file's contents, or the system's trust store, `ca-certificates` on
/// Debian), and optionally a client certificate (PEM, chain allowed) with its private key (PEM).
///
/// Source: GnuTLS 3.7 manual, "Certificate credentials" (`gnutls_certificate_set_x509_trust_mem`,
/// `gnutls_certificate_set_x509_system_trust`, `gnutls_certificate_set_x509_key_mem`).
///
/// Thread-safety: `Sendable`. It is `@unchecked` because it holds a C pointer: GnuTLS' manual
/// ("Thread safety") allows one credentials structure to be used by sessions on many threads at
/// once once it is set up, and nothing changes it after `init` (it is freed only by `deinit`).
public final class TLSClientCredentials: @unchecked Sendable {
    let credentials: gnutls_certificate_credentials_t

    /// Loads the trust anchors and the client certificate.
    /// - Parameters:
    ///   - caPEM: the CA certificates (PEM); `nil` for the system's trust store.
    ///   - certificatePEM: the client certificate (PEM, chain allowed), or `nil` for none.
    ///   - keyPEM: its private key (PEM, unencrypted); given exactly when `certificatePEM` is.
    /// - Throws: `TLSError` saying which part could not be read (never the key's contents).
    public init(caPEM: [UInt8]?, certificatePEM: [UInt8]?, keyPEM: [UInt8]?) throws(TLSError) {
        var made: gnutls_certificate_credentials_t?
        let allocated = gnutls_certificate_allocate_credentials(&made)
        guard allocated == GNUTLS_E_SUCCESS, let made else {
            throw TLSError.gnutls(allocated, "cannot allocate TLS credentials")
        }
        credentials = made
        if let caPEM {
            let count = Self.withDatum(caPEM) { gnutls_certificate_set_x509_trust_mem(made, $0, GNUTLS_X509_FMT_PEM) }
            if count < 0 { throw TLSError.gnutls(count, "the CA file holds no usable certificate") }
            if count == 0 { throw TLSError("the CA file holds no PEM certificate") }
        } else {
            let count = gnutls_certificate_set_x509_system_trust(made)
            if count <= 0 {
                throw TLSError(
                    "the system trust store holds no certificate (install ca-certificates, or give a CA file)")
            }
        }
        switch (certificatePEM, keyPEM) {
        case (let certificate?, let key?):
            let result = Self.withDatum(certificate) { cert in
                Self.withDatum(key) { key in
                    gnutls_certificate_set_x509_key_mem(made, cert, key, GNUTLS_X509_FMT_PEM)
                }
            }
            if result < 0 {
                throw TLSError.gnutls(result, "the client certificate and key could not be loaded")
            }
        case (nil, nil):
            break
        default:
            throw TLSError("a client certificate needs its key, and a key its certificate")
        }
    }

    deinit {
        gnutls_certificate_free_credentials(credentials)
    }

    static func withDatum<R>(_ bytes: [UInt8], _ body: (UnsafePointer<gnutls_datum_t>) -> R) -> R {
        var copy = bytes
        return copy.withUnsafeMutableBufferPointer { buffer in
            var datum = gnutls_datum_t(data: buffer.baseAddress, size: UInt32(buffer.count))
            return body(&datum)
        }
    }
}

/// One TLS 1.2 or 1.3 client session over a non-blocking socket that the caller owns and polls:
/// each step returns what it waits for instead of blocking.
///
/// The server's certificate is always verified during the handshake: its chain to one of the
/// credentials' CAs, its validity dates, its purpose (with an extended key usage extension, it
/// must list TLS server authentication), and the host connected to (a DNS name against the
/// certificate's DNS names, sent as SNI; an IP address against its IP addresses). Names are
/// matched against the subject alternative names only, never the common name (as browsers and Go
/// do; docs/replicas.md, "TLS to Redis"): GnuTLS 3.7 falls back to the common name when a
/// certificate has no DNS name, so after the handshake a certificate for a DNS host without one is
/// refused. There is no way to skip the check. A failed verification says what
/// failed: the subject, and "signed by an unknown authority", "expired", "not yet valid", "name
/// does not match HOST", "not meant for a TLS server"...
///
/// The other check, `init(fd:presenting:)`, is for a process asking the service it runs beside
/// (`forge-push-token-server --health-check`, over a loopback address its certificate does not
/// name): the server must present exactly the certificate it is configured with, byte for byte.
///
/// Source: GnuTLS 3.7 manual, "Client examples" (`gnutls_session_set_verify_cert`,
/// `gnutls_session_set_verify_cert2`, `gnutls_handshake`, `gnutls_record_recv`,
/// `gnutls_record_send`, non-blocking use with `GNUTLS_E_AGAIN` and
/// `gnutls_record_get_direction`).
///
/// Thread-safety: not thread-safe, not `Sendable`: one thread owns a session (and its socket).
public final class TLSClientSession {
    /// What a step waits for before it can go on.
    public enum Wait: Sendable, Equatable {
        /// The socket to become readable.
        case readable
        /// The socket to become writable.
        case writable
    }

    /// The outcome of `receive`.
    public enum Received: Sendable, Equatable {
        /// This many bytes were stored.
        case bytes(Int)
        /// The server closed the session (or the connection).
        case closed
        /// Nothing yet: wait for the socket, then call again.
        case wait(Wait)
    }

    private let session: gnutls_session_t
    private let credentials: TLSClientCredentials
    private let host: String
    /// Whether `host` is a DNS name (not an IP address literal): its certificate must then name
    /// it in a DNS subject alternative name.
    private let isDNSHost: Bool
    /// What the verification reads during the handshake: the host's C string (`strdup`) or an IP
    /// address's bytes, the key purpose OID (`strdup`), and the two `gnutls_typed_vdata_st` that
    /// point to them; freed by `deinit`.
    private var hostBytes: UnsafeMutablePointer<UInt8>?
    private var purposeOID: UnsafeMutablePointer<CChar>?
    private var verifyData: UnsafeMutablePointer<gnutls_typed_vdata_st>?
    /// With `init(fd:presenting:)`: the DER bytes the server's certificate must be (the
    /// handshake then verifies nothing else); `nil` with `init(fd:host:credentials:)`.
    private let pinnedCertificate: [UInt8]?

    /// A session on socket `fd` (non-blocking, connected) to `host` (a DNS name or an IP
    /// address literal without brackets), trusting `credentials`.
    /// - Throws: `TLSError` when GnuTLS cannot set the session up.
    public convenience init(fd: Int32, host: String, credentials: TLSClientCredentials) throws(TLSError) {
        try self.init(fd: fd, host: host, credentials: credentials, pinnedCertificate: nil)
    }

    /// A session on socket `fd` (non-blocking, connected) to a server that must present the
    /// first certificate of `certificatePEM` (PEM text, as a server's certificate file holds it,
    /// intermediates after it ignored), byte for byte: the handshake fails otherwise. Neither its
    /// chain, its dates nor its names are checked (the address is the caller's own loopback one,
    /// and a server holding that certificate's private key is the one configured with it). No
    /// server name is sent.
    /// - Throws: `TLSError` when `certificatePEM` holds no certificate, or GnuTLS cannot set the
    ///   session up.
    public convenience init(fd: Int32, presenting certificatePEM: [UInt8]) throws(TLSError) {
        let expected = try Self.firstCertificateDER(certificatePEM)
        // Credentials with the certificate as trust anchor: nothing is verified against them (no
        // `gnutls_session_set_verify_cert2`), but GnuTLS needs certificate credentials set.
        let credentials = try TLSClientCredentials(caPEM: certificatePEM, certificatePEM: nil, keyPEM: nil)
        try self.init(fd: fd, host: "the local service", credentials: credentials, pinnedCertificate: expected)
    }

    /// The session both public initialisers make: with `pinnedCertificate`, no verification is
    /// set up (the handshake compares the server's certificate with it); without, the chain, dates,
    /// purpose and `host` are verified.
    private init(
        fd: Int32, host: String, credentials: TLSClientCredentials, pinnedCertificate: [UInt8]?
    ) throws(TLSError) {
        self.pinnedCertificate = pinnedCertificate
        var made: gnutls_session_t?
        let result = gnutls_init(&made, UInt32(GNUTLS_CLIENT.rawValue) | UInt32(GNUTLS_NONBLOCK))
        guard result == GNUTLS_E_SUCCESS, let made else { throw TLSError.gnutls(result, "cannot start TLS") }
        session = made
        self.credentials = credentials
        self.host = host
        var failed: Int32 = gnutls_priority_set_direct(made, "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2", nil)
        if failed == GNUTLS_E_SUCCESS {
            failed = gnutls_credentials_set(
                made, GNUTLS_CRD_CERTIFICATE, UnsafeMutableRawPointer(credentials.credentials))
        }
        guard failed == GNUTLS_E_SUCCESS else { throw TLSError.gnutls(failed, "cannot start TLS") }
        if pinnedCertificate != nil {
            isDNSHost = false
            fpt_gnutls_transport_set_int(made, fd)
            return
        }
        // GnuTLS keeps the pointers it is given here (not copies) until the session ends: they
        // live in `hostBytes`, `purposeOID` and `verifyData`, freed by `deinit`.
        let name: gnutls_typed_vdata_st
        if let address = Self.ipAddress(host) {
            let bytes = UnsafeMutablePointer<UInt8>.allocate(capacity: address.count)
            bytes.initialize(from: address, count: address.count)
            hostBytes = bytes
            isDNSHost = false
            name = gnutls_typed_vdata_st(type: GNUTLS_DT_IP_ADDRESS, data: bytes, size: UInt32(address.count))
        } else {
            failed = gnutls_server_name_set(made, GNUTLS_NAME_DNS, host, host.utf8.count)
            guard failed == GNUTLS_E_SUCCESS else { throw TLSError.gnutls(failed, "cannot set the server name") }
            // A NUL-terminated string: size 0 (GnuTLS manual, `gnutls_typed_vdata_st`).
            let bytes = UnsafeMutablePointer<UInt8>.allocate(capacity: host.utf8.count + 1)
            bytes.initialize(from: Array(host.utf8) + [0], count: host.utf8.count + 1)
            hostBytes = bytes
            isDNSHost = true
            name = gnutls_typed_vdata_st(type: GNUTLS_DT_DNS_HOSTNAME, data: bytes, size: 0)
        }
        // The certificate must be meant for a TLS server: one with an extended key usage must list
        // serverAuth (GNUTLS_KP_TLS_WWW_SERVER); one without is accepted (RFC 5280 §4.2.1.12).
        let purpose = strdup(GNUTLS_KP_TLS_WWW_SERVER)
        purposeOID = purpose
        let data = UnsafeMutablePointer<gnutls_typed_vdata_st>.allocate(capacity: 2)
        data.initialize(to: name)
        (data + 1).initialize(
            to: gnutls_typed_vdata_st(
                type: GNUTLS_DT_KEY_PURPOSE_OID,
                data: purpose.map { UnsafeMutableRawPointer($0).assumingMemoryBound(to: UInt8.self) },
                size: 0))
        verifyData = data
        gnutls_session_set_verify_cert2(made, data, 2, 0)
        fpt_gnutls_transport_set_int(made, fd)
    }

    deinit {
        gnutls_deinit(session)
        hostBytes?.deallocate()
        free(purposeOID)
        verifyData?.deallocate()
    }

    /// Runs the handshake as far as it goes: `nil` when it is done, else what it waits for.
    /// - Throws: `TLSError` saying what failed (the certificate's verification, or the protocol).
    public func handshake() throws(TLSError) -> Wait? {
        let result = gnutls_handshake(session)
        if result == GNUTLS_E_SUCCESS {
            if let pinnedCertificate {
                let presented = withPeerDER { $0 }
                guard presented == pinnedCertificate else {
                    throw TLSError(
                        "\(host) presented certificate \(peerSubject), not the one it is configured with")
                }
                return nil
            }
            // GnuTLS matched a DNS host against the common name when the certificate has no DNS
            // name (`gnutls_x509_crt_check_hostname2`; 3.7 has no flag against it): refused here.
            if isDNSHost, !peerHasDNSName {
                throw TLSError(
                    "certificate \(peerSubject) of \(host): no DNS name among its subject alternative names"
                        + " (the common name is not matched)")
            }
            return nil
        }
        if result == GNUTLS_E_AGAIN || result == GNUTLS_E_INTERRUPTED { return direction }
        if result == GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR { throw verificationError() }
        throw TLSError.gnutls(result, "TLS handshake with \(host) failed")
    }

    /// Reads decrypted bytes into `buffer`.
    /// - Throws: `TLSError` when the session breaks.
    public func receive(into buffer: UnsafeMutableRawBufferPointer) throws(TLSError) -> Received {
        let result = gnutls_record_recv(session, buffer.baseAddress, buffer.count)
        if result > 0 { return .bytes(result) }
        if result == 0 { return .closed }
        let code = Int32(result)
        if code == GNUTLS_E_AGAIN || code == GNUTLS_E_INTERRUPTED { return .wait(direction ?? .readable) }
        if code == GNUTLS_E_PREMATURE_TERMINATION { return .closed }
        throw TLSError.gnutls(code, "TLS read from \(host) failed")
    }

    /// Encrypts and sends bytes of `buffer`: how many were taken (0: wait for the socket to be
    /// writable and call again with the same bytes, as GnuTLS requires).
    /// - Throws: `TLSError` when the session breaks.
    public func send(_ buffer: UnsafeRawBufferPointer) throws(TLSError) -> Int {
        let result = gnutls_record_send(session, buffer.baseAddress, buffer.count)
        if result >= 0 { return result }
        let code = Int32(result)
        if code == GNUTLS_E_AGAIN || code == GNUTLS_E_INTERRUPTED { return 0 }
        throw TLSError.gnutls(code, "TLS write to \(host) failed")
    }

    /// Whether decrypted bytes wait in the session (poll(2) on the socket would not show them).
    public var hasBufferedBytes: Bool { gnutls_record_check_pending(session) > 0 }

    private var direction: Wait? {
        gnutls_record_get_direction(session) == 1 ? .writable : .readable
    }

    /// What the server's certificate failed: its subject, and each reason in words.
    private func verificationError() -> TLSError {
        let status = gnutls_session_get_verify_cert_status(session)
        var reasons: [String] = []
        let known: [(gnutls_certificate_status_t, String)] = [
            (GNUTLS_CERT_SIGNER_NOT_FOUND, "signed by an unknown authority"),
            (GNUTLS_CERT_SIGNER_NOT_CA, "signed by a certificate that is not a CA"),
            (GNUTLS_CERT_EXPIRED, "expired"),
            (GNUTLS_CERT_NOT_ACTIVATED, "not yet valid"),
            (GNUTLS_CERT_UNEXPECTED_OWNER, "name does not match \(host)"),
            (GNUTLS_CERT_REVOKED, "revoked"),
            (GNUTLS_CERT_SIGNATURE_FAILURE, "signature does not verify"),
            (GNUTLS_CERT_INSECURE_ALGORITHM, "signed with an insecure algorithm"),
            (
                GNUTLS_CERT_PURPOSE_MISMATCH,
                "not meant for a TLS server (its extended key usage does not list serverAuth)"
            ),
        ]
        for (flag, words) in known where status & flag.rawValue != 0 { reasons.append(words) }
        if reasons.isEmpty {
            var text = gnutls_datum_t()
            if gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &text, 0) == GNUTLS_E_SUCCESS,
                let data = text.data
            {
                reasons.append(String(decoding: UnsafeBufferPointer(start: data, count: Int(text.size)), as: UTF8.self))
                fpt_gnutls_free(data)
            } else {
                reasons.append("not trusted")
            }
        }
        return TLSError("certificate \(peerSubject) of \(host): \(reasons.joined(separator: ", "))")
    }

    /// The subject of the server's certificate (RFC 4514 form), or "(none)".
    private var peerSubject: String {
        withPeerCertificate { certificate in
            guard let certificate else { return "(none)" }
            var name = gnutls_datum_t()
            guard gnutls_x509_crt_get_dn3(certificate, &name, 0) == GNUTLS_E_SUCCESS, let data = name.data else {
                return "(unnamed)"
            }
            defer { fpt_gnutls_free(data) }
            return String(decoding: UnsafeBufferPointer(start: data, count: Int(name.size)), as: UTF8.self)
        }
    }

    /// Whether the server's certificate lists a DNS name (`GNUTLS_SAN_DNSNAME`) among its subject
    /// alternative names (`gnutls_x509_crt_get_subject_alt_name`, in order until
    /// `GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE`); false without a certificate.
    private var peerHasDNSName: Bool {
        withPeerCertificate { certificate in
            guard let certificate else { return false }
            var buffer = [UInt8](repeating: 0, count: 512)
            var sequence: UInt32 = 0
            while true {
                var size = buffer.count
                let type = gnutls_x509_crt_get_subject_alt_name(certificate, sequence, &buffer, &size, nil)
                if type == GNUTLS_E_SHORT_MEMORY_BUFFER {
                    // `size` now holds what the name needs: the same entry again, with room for it.
                    buffer = [UInt8](repeating: 0, count: size + 1)
                    continue
                }
                if type < 0 { return false }  // GNUTLS_E_REQUESTED_DATA_NOT_AVAILABLE: no more names
                if type == Int32(GNUTLS_SAN_DNSNAME.rawValue) { return true }
                sequence += 1
            }
        }
    }

    /// Runs `body` with the DER bytes of the server's certificate (`nil` when it sent none).
    private func withPeerDER<R>(_ body: ([UInt8]?) -> R) -> R {
        var count: UInt32 = 0
        guard let peers = gnutls_certificate_get_peers(session, &count), count > 0, let data = peers.pointee.data else {
            return body(nil)
        }
        return body(Array(UnsafeBufferPointer(start: data, count: Int(peers.pointee.size))))
    }

    /// The DER bytes of the first certificate of PEM text `pem`.
    /// - Throws: `TLSError` when it holds no readable certificate.
    private static func firstCertificateDER(_ pem: [UInt8]) throws(TLSError) -> [UInt8] {
        var certificate: gnutls_x509_crt_t?
        var result = gnutls_x509_crt_init(&certificate)
        guard result == GNUTLS_E_SUCCESS, let certificate else {
            throw TLSError.gnutls(result, "cannot read the certificate")
        }
        defer { gnutls_x509_crt_deinit(certificate) }
        result = TLSClientCredentials.withDatum(pem) { gnutls_x509_crt_import(certificate, $0, GNUTLS_X509_FMT_PEM) }
        guard result == GNUTLS_E_SUCCESS else {
            throw TLSError.gnutls(result, "the certificate file holds no certificate")
        }
        var der = gnutls_datum_t()
        result = gnutls_x509_crt_export2(certificate, GNUTLS_X509_FMT_DER, &der)
        guard result == GNUTLS_E_SUCCESS, let data = der.data else {
            throw TLSError.gnutls(result, "cannot read the certificate")
        }
        defer { fpt_gnutls_free(data) }
        return Array(UnsafeBufferPointer(start: data, count: Int(der.size)))
    }

    /// Runs `body` with the server's certificate, parsed (`nil` when it sent none or it cannot be
    /// read); the certificate lives for the call only.
    private func withPeerCertificate<R>(_ body: (gnutls_x509_crt_t?) -> R) -> R {
        var count: UInt32 = 0
        guard let peers = gnutls_certificate_get_peers(session, &count), count > 0 else { return body(nil) }
        var certificate: gnutls_x509_crt_t?
        guard gnutls_x509_crt_init(&certificate) == GNUTLS_E_SUCCESS, let certificate else { return body(nil) }
        defer { gnutls_x509_crt_deinit(certificate) }
        guard gnutls_x509_crt_import(certificate, peers, GNUTLS_X509_FMT_DER) == GNUTLS_E_SUCCESS else {
            return body(nil)
        }
        return body(certificate)
    }

    /// The bytes of `host` when it is an IPv4 or IPv6 literal, else `nil`.
    private static func ipAddress(_ host: String) -> [UInt8]? {
        var v4 = [UInt8](repeating: 0, count: 4)
        if inet_pton(AF_INET, host, &v4) == 1 { return v4 }
        var v6 = [UInt8](repeating: 0, count: 16)
        if inet_pton(AF_INET6, host, &v6) == 1 { return v6 }
        return nil
    }
}
