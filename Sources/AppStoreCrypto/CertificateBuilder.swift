import COpenSSL
import Foundation

/// Issues X.509 certificates (used to build the emulator's Apple-shaped chain).
public struct CertificateBuilder: Sendable {
    /// Subject attributes in order, e.g. `[("CN", "…"), ("O", "…"), ("C", "US")]`.
    public var subject: [(String, String)]
    public var serial: UInt64
    public var notBefore: Date
    public var notAfter: Date
    /// CA certificates get basicConstraints CA:TRUE (with `pathLength`), keyCertSign and cRLSign.
    public var isCertificateAuthority: Bool
    public var pathLength: Int?
    /// Marker extensions to add with a NULL value, non-critical (Apple's OIDs).
    public var markerExtensions: [String]
    /// More extensions in OpenSSL's configuration syntax, e.g. `("subjectAltName", "DNS:a.example")`,
    /// `("extendedKeyUsage", "serverAuth")`, `("authorityInfoAccess", "OCSP;URI:https://ocsp.example/")`.
    public var extensions: [(String, String)] = []

    /// Creates a builder.
    public init(subject: [(String, String)], serial: UInt64, notBefore: Date, notAfter: Date,
                isCertificateAuthority: Bool, pathLength: Int? = nil, markerExtensions: [String] = []) {
        self.subject = subject
        self.serial = serial
        self.notBefore = notBefore
        self.notAfter = notAfter
        self.isCertificateAuthority = isCertificateAuthority
        self.pathLength = pathLength
        self.markerExtensions = markerExtensions
    }

    /// Issues the certificate for `key`, signed by `issuerKey` (self-signed when `issuer` is nil).
    public func issue(for key: PrivateKey, issuer: Certificate?, issuerKey: PrivateKey) throws -> Certificate {
        guard let x509 = X509_new() else { throw CryptoError.openSSL("certificate_failed", "cannot allocate") }
        var owned = true
        defer { if owned { X509_free(x509) } }
        X509_set_version(x509, 2)
        ASN1_INTEGER_set_uint64(X509_get_serialNumber(x509), serial)
        ASN1_TIME_set(X509_getm_notBefore(x509), time_t(notBefore.timeIntervalSince1970))
        ASN1_TIME_set(X509_getm_notAfter(x509), time_t(notAfter.timeIntervalSince1970))
        let name = X509_get_subject_name(x509)
        for (field, value) in subject {
            guard X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8, value, -1, -1, 0) == 1 else {
                throw CryptoError.openSSL("certificate_failed", "bad subject field \(field)")
            }
        }
        X509_set_issuer_name(x509, issuer.map { X509_get_subject_name($0.pointer) } ?? name)
        X509_set_pubkey(x509, key.pointer)

        var context = X509V3_CTX()
        X509V3_set_ctx(&context, issuer?.pointer ?? x509, x509, nil, nil, 0)
        var extensions: [(String, String)] = []
        if isCertificateAuthority {
            extensions.append(("basicConstraints", "critical,CA:TRUE" + (pathLength.map { ",pathlen:\($0)" } ?? "")))
            extensions.append(("keyUsage", "critical,keyCertSign,cRLSign"))
        } else {
            extensions.append(("basicConstraints", "critical,CA:FALSE"))
            extensions.append(("keyUsage", "critical,digitalSignature"))
        }
        extensions.append(("subjectKeyIdentifier", "hash"))
        if issuer != nil { extensions.append(("authorityKeyIdentifier", "keyid:always")) }
        for oid in markerExtensions { extensions.append((oid, "DER:05:00")) }
        extensions += self.extensions
        for (name, value) in extensions {
            guard let ext = X509V3_EXT_nconf(nil, &context, name, value) else {
                throw CryptoError.openSSL("certificate_failed", "cannot build extension \(name)")
            }
            X509_add_ext(x509, ext, -1)
            X509_EXTENSION_free(ext)
        }
        guard X509_sign(x509, issuerKey.pointer, Digest.sha256.md) > 0 else { throw CryptoError.openSSL("certificate_failed", "signing failed") }
        owned = false
        return try Certificate(owning: x509)
    }
}
