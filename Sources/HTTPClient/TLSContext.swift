import COpenSSL
import Foundation

/// Owns an OpenSSL client context: peer verification on, system roots plus an optional CA file.
final class TLSContext: @unchecked Sendable {
    let context: OpaquePointer

    init(caFile: String?) throws(HTTPClientError) {
        guard let context = SSL_CTX_new(TLS_client_method()) else { throw HTTPClientError(.tlsFailed, "SSL_CTX_new: \(Self.lastError())") }
        self.context = context
        SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nil)
        SSL_CTX_set_default_verify_paths(context)
        if let caFile, SSL_CTX_load_verify_locations(context, caFile, nil) != 1 {
            throw HTTPClientError(.tlsFailed, "cannot load CA file \(caFile): \(Self.lastError())")
        }
    }

    deinit { SSL_CTX_free(context) }

    /// A session for one connection on `fd`, checking the certificate names `host`.
    func session(fd: Int32, host: String) throws(HTTPClientError) -> TLSSession {
        guard let ssl = SSL_new(context) else { throw HTTPClientError(.tlsFailed, "SSL_new: \(Self.lastError())") }
        SSL_set_fd(ssl, fd)
        if Resolver.numeric(host, port: 0) == nil {
            _ = shim_SSL_set_tlsext_host_name(ssl, host)
            SSL_set1_host(ssl, host)
        } else {
            X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host)
        }
        return TLSSession(ssl: ssl)
    }

    static func lastError() -> String {
        let code = ERR_get_error()
        guard code != 0 else { return "unknown error" }
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        ERR_clear_error()
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// What one non-blocking read, write or handshake step came to.
enum IOStep {
    case done(Int)
    case wouldBlock
    case closed
    case failed(HTTPClientError)
}

/// One TLS connection's OpenSSL state; used only on the event-loop thread.
final class TLSSession {
    let ssl: OpaquePointer
    private(set) var established = false

    init(ssl: OpaquePointer) { self.ssl = ssl }

    deinit { SSL_free(ssl) }

    func handshake() -> IOStep {
        let result = SSL_connect(ssl)
        if result == 1 {
            established = true
            return .done(0)
        }
        return classify(result, during: "TLS handshake")
    }

    func read(into buffer: UnsafeMutableRawBufferPointer) -> IOStep {
        let result = SSL_read(ssl, buffer.baseAddress, Int32(buffer.count))
        return result > 0 ? .done(Int(result)) : classify(result, during: "TLS read")
    }

    func write(_ bytes: UnsafeRawBufferPointer) -> IOStep {
        let result = SSL_write(ssl, bytes.baseAddress, Int32(bytes.count))
        return result > 0 ? .done(Int(result)) : classify(result, during: "TLS write")
    }

    private func classify(_ result: Int32, during action: String) -> IOStep {
        let error = SSL_get_error(ssl, result)
        switch error {
        case SSL_ERROR_WANT_READ, SSL_ERROR_WANT_WRITE:
            return .wouldBlock
        case SSL_ERROR_ZERO_RETURN:
            return .closed
        case SSL_ERROR_SYSCALL where errno == 0 || errno == ECONNRESET || errno == EPIPE:
            ERR_clear_error()
            return .closed
        default:
            let verify = SSL_get_verify_result(ssl)
            if verify != X509_V_OK {
                ERR_clear_error()
                let reason = String(cString: X509_verify_cert_error_string(verify))
                return .failed(HTTPClientError(.tlsFailed, "\(action): certificate not trusted (\(reason))"))
            }
            return .failed(HTTPClientError(.tlsFailed, "\(action): \(TLSContext.lastError())"))
        }
    }
}
