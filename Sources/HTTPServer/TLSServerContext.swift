import COpenSSL
import Foundation

/// Owns an OpenSSL server context: one certificate chain and key, TLS 1.2 or later, and a server-name
/// check that refuses every name outside `hosts` with an `unrecognized_name` alert.
final class TLSServerContext: @unchecked Sendable {
    // Immutable after init; OpenSSL allows one SSL_CTX to serve many connections on many threads.
    let context: OpaquePointer
    let hosts: Set<String>

    /// A failure to build the context (a bad certificate or key).
    struct SetupError: Error, CustomStringConvertible {
        let description: String
    }

    /// - Parameters:
    ///   - certificateChainPEM: the server certificate first, then its intermediates (the root may follow; it is skipped).
    ///   - privateKeyPEM: the server certificate's key.
    ///   - hosts: the server names accepted in SNI, lowercased. A ClientHello without SNI is accepted.
    init(certificateChainPEM: String, privateKeyPEM: String, hosts: Set<String>) throws(SetupError) {
        guard let context = SSL_CTX_new(TLS_server_method()) else { throw SetupError(description: "SSL_CTX_new failed") }
        self.context = context
        self.hosts = Set(hosts.map { $0.lowercased() })
        _ = shim_SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION)
        _ = shim_SSL_CTX_set_server_options(context)
        _ = shim_SSL_CTX_set_mode(context, Int(SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER))
        let certificates = Self.readCertificates(certificateChainPEM)
        guard let leaf = certificates.first else { throw SetupError(description: "no certificate in the TLS chain") }
        guard SSL_CTX_use_certificate(context, leaf) == 1 else { throw SetupError(description: "the TLS certificate is not usable") }
        X509_free(leaf)
        for certificate in certificates.dropFirst() {
            // The context takes ownership of extra chain certificates.
            if X509_check_issued(certificate, certificate) == X509_V_OK {
                X509_free(certificate)
            } else if shim_SSL_CTX_add_extra_chain_cert(context, certificate) != 1 {
                X509_free(certificate)
            }
        }
        guard let key = Self.withBIO(privateKeyPEM, { PEM_read_bio_PrivateKey($0, nil, nil, nil) }) else {
            throw SetupError(description: "the TLS key is not a PEM private key")
        }
        defer { EVP_PKEY_free(key) }
        guard SSL_CTX_use_PrivateKey(context, key) == 1, SSL_CTX_check_private_key(context) == 1 else {
            throw SetupError(description: "the TLS key does not match its certificate")
        }
        _ = shim_SSL_CTX_set_servername_callback(context, serverNameCallback, Unmanaged.passUnretained(self).toOpaque())
    }

    deinit { SSL_CTX_free(context) }

    /// Whether `name` (from SNI or a CONNECT line) is one this context serves.
    func serves(_ name: String) -> Bool { hosts.contains(name.lowercased()) }

    private static func readCertificates(_ pem: String) -> [OpaquePointer] {
        withBIO(pem) { bio in
            var certificates: [OpaquePointer] = []
            while let certificate = PEM_read_bio_X509(bio, nil, nil, nil) { certificates.append(certificate) }
            ERR_clear_error()  // the read that ends the loop leaves "no start line" queued
            return certificates
        } ?? []
    }

    /// Runs `body` on a read-only memory BIO over `text`; the BIO borrows the bytes, so it must not outlive the call.
    private static func withBIO<T>(_ text: String, _ body: (OpaquePointer) -> T?) -> T? {
        let bytes = Array(text.utf8)
        return bytes.withUnsafeBytes { buffer -> T? in
            guard let bio = BIO_new_mem_buf(buffer.baseAddress, Int32(buffer.count)) else { return nil }
            defer { BIO_free(bio) }
            return body(bio)
        }
    }
}

/// Refuses a server name the context does not serve, so a client learns at once that it reached the wrong place.
private let serverNameCallback: @convention(c) (OpaquePointer?, UnsafeMutablePointer<Int32>?, UnsafeMutableRawPointer?) -> Int32 = { ssl, alert, argument in
    guard let argument, let name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name) else { return SSL_TLSEXT_ERR_OK }
    let context = Unmanaged<TLSServerContext>.fromOpaque(argument).takeUnretainedValue()
    if context.serves(String(cString: name)) { return SSL_TLSEXT_ERR_OK }
    alert?.pointee = Int32(SSL_AD_UNRECOGNIZED_NAME)
    return SSL_TLSEXT_ERR_ALERT_FATAL
}
