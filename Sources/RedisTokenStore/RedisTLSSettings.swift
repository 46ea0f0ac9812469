import GnuTLSClient

/// What a replica trusts and presents on a `rediss://` connection (docs/replicas.md, "TLS to
/// Redis"): the CA certificates that may sign the Redis server's certificate (PEM; `nil` for the
/// system's trust store, `ca-certificates` on Debian), and a client certificate (PEM, chain
/// allowed) with its private key (PEM) for servers that require one (`tls-auth-clients yes`).
///
/// The server's certificate is always verified (chain, dates, host name or IP address); there is
/// no setting to skip that. The description names what is set, never the key.
///
/// Thread-safety: a value type, `Sendable`.
public struct RedisTLSSettings: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The CA certificates (a PEM file's contents), or `nil` for the system's trust store.
    public var caPEM: [UInt8]?
    /// The client certificate (PEM, chain allowed), or `nil` for none.
    public var certificatePEM: [UInt8]?
    /// The client certificate's private key (PEM, unencrypted), or `nil` for none.
    public var keyPEM: [UInt8]?

    /// Settings from their parts; the defaults are the system's trust store and no client
    /// certificate.
    public init(caPEM: [UInt8]? = nil, certificatePEM: [UInt8]? = nil, keyPEM: [UInt8]? = nil) {
        self.caPEM = caPEM
        self.certificatePEM = certificatePEM
        self.keyPEM = keyPEM
    }

    /// The part of the settings that could not be loaded.
    public enum Part: Sendable, Equatable {
        /// `caPEM`.
        case caFile
        /// The system's trust store (no `caPEM`).
        case systemTrustStore
        /// `certificatePEM` with `keyPEM`.
        case clientCertificate
    }

    /// Why the settings cannot be loaded: the part, and the reason in words (never the key's
    /// contents).
    public struct Invalid: Error, Sendable, Equatable, CustomStringConvertible {
        /// The part that failed.
        public let part: Part
        /// What is wrong with it.
        public let description: String
    }

    /// Checks that GnuTLS can load the settings, as a replica does when it starts.
    /// - Throws: `Invalid` naming the part that could not be loaded and why.
    public func validate() throws(Invalid) {
        do throws(TLSError) {
            _ = try TLSClientCredentials(caPEM: caPEM, certificatePEM: nil, keyPEM: nil)
        } catch {
            throw Invalid(part: caPEM == nil ? .systemTrustStore : .caFile, description: error.description)
        }
        if certificatePEM != nil || keyPEM != nil {
            do throws(TLSError) {
                _ = try credentials()
            } catch {
                throw Invalid(part: .clientCertificate, description: error.description)
            }
        }
    }

    /// The credentials for TLS sessions.
    func credentials() throws(TLSError) -> TLSClientCredentials {
        try TLSClientCredentials(caPEM: caPEM, certificatePEM: certificatePEM, keyPEM: keyPEM)
    }

    /// "CA file" or "system trust store", and whether a client certificate is set.
    public var description: String {
        (caPEM == nil ? "system trust store" : "CA file") + (certificatePEM == nil ? "" : ", client certificate")
    }

    /// The same as `description`: the key never appears in a dump either.
    public var debugDescription: String { description }
}
