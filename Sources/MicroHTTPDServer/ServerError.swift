import ForgePushToken
import ServerSupport

/// Why a `MicroHTTPDServer` could not start.
public enum ServerError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The host is not an IPv4 or IPv6 literal nor `localhost`.
    case invalidHost(String)
    /// The address is already in use (`EADDRINUSE` from `bind(2)`).
    case addressInUse(String)
    /// A socket call failed; `call` names it, `errno` is the C error number.
    case socket(call: String, address: String, errno: Int32)
    /// `MHD_start_daemon` returned no daemon.
    case daemonStartFailed(String)
    /// HTTPS was asked for, but this libmicrohttpd was built without TLS support.
    case tlsUnsupported
    /// libmicrohttpd (GnuTLS) could not use the certificate and key; its own message is in the log.
    case tlsCredentialsRejected(String)

    /// A one-line message naming the address.
    public var description: String {
        switch self {
        case .invalidHost(let host): "invalid host \(host): expected an IPv4 or IPv6 literal or localhost"
        case .addressInUse(let address): "address \(address) is already in use"
        case .socket(let call, let address, let code): "\(call) failed for \(address): \(systemErrorText(code))"
        case .daemonStartFailed(let address): "libmicrohttpd could not start on \(address)"
        case .tlsUnsupported: "this libmicrohttpd was built without HTTPS (GnuTLS) support"
        case .tlsCredentialsRejected(let address):
            "libmicrohttpd could not start HTTPS on \(address) with the certificate and key given"
                + " (PEM, key unencrypted and matching the certificate; see the log line above)"
        }
    }
}
