import AppStoreCrypto
import AppStoreModels
import Foundation

/// Xcode's StoreKit Testing signs with one self-signed certificate, `CN=StoreKit Testing in Xcode` (EC P-256,
/// CA:TRUE), `kid` `Apple_Xcode_Key`, and the payloads say `environment` `Xcode`. The emulator makes its own
/// certificate of that shape (Apple's key is Xcode's), so a backend can check that it refuses such data (its
/// chain is one certificate, not Apple's three), or that it accepts it only when configured to.
/// Its receipts are signed by another self-signed certificate, `CN=StoreKit, O=StoreKit, OU=StoreKit, C=US`
/// (RSA 2048, SHA-256), in Xcode's BER layout.
public struct XcodeAuthority: Sendable {
    public let certificate: Certificate
    public let key: PrivateKey
    /// The receipt signer, when the data directory has one (made on first use).
    public var receiptCertificate: Certificate?
    public var receiptKey: PrivateKey?
    /// The `kid` Xcode puts in its JWS headers.
    public static let keyId = "Apple_Xcode_Key"

    /// A fresh certificate valid 2000–2099.
    public static func generate() throws -> XcodeAuthority {
        let key = try PrivateKey.generateEC(curve: "P-256")
        let certificate = try CertificateBuilder(
            subject: [("CN", "StoreKit Testing in Xcode")], serial: UInt64.random(in: 1...UInt64(1) << 48),
            notBefore: Date(timeIntervalSince1970: 946_684_800), notAfter: Date(timeIntervalSince1970: 4_102_444_799), isCertificateAuthority: true
        ).issue(for: key, issuer: nil, issuerKey: key)
        var authority = XcodeAuthority(certificate: certificate, key: key)
        try authority.makeReceiptSigner()
        return authority
    }

    /// A self-signed RSA certificate shaped like Xcode's receipt signer.
    mutating func makeReceiptSigner() throws {
        let key = try PrivateKey.generateRSA(bits: 2048)
        var builder = CertificateBuilder(
            subject: [("CN", "StoreKit"), ("O", "StoreKit"), ("OU", "StoreKit"), ("C", "US")], serial: 1,
            notBefore: Date(timeIntervalSince1970: 946_684_800), notAfter: Date(timeIntervalSince1970: 4_102_444_799), isCertificateAuthority: true)
        builder.extensions = [("extendedKeyUsage", "critical,codeSigning")]
        receiptCertificate = try builder.issue(for: key, issuer: nil, issuerKey: key)
        receiptKey = key
    }

    /// Loads it from `directory` (`xcode.pem`, `xcode-key.pem`), making and saving it on first use.
    public static func loadOrCreate(in directory: URL) throws -> XcodeAuthority {
        let certificateFile = directory.appendingPathComponent("xcode.pem"), keyFile = directory.appendingPathComponent("xcode-key.pem")
        let receiptFile = directory.appendingPathComponent("xcode-receipt.pem"), receiptKeyFile = directory.appendingPathComponent("xcode-receipt-key.pem")
        var authority: XcodeAuthority
        if let certificate = try? String(contentsOf: certificateFile, encoding: .utf8), let key = try? String(contentsOf: keyFile, encoding: .utf8) {
            authority = XcodeAuthority(certificate: try Certificate.parsePEM(certificate)[0], key: try PrivateKey(pem: key))
        } else {
            authority = try generate()
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            try authority.certificate.pem.write(to: certificateFile, atomically: true, encoding: .utf8)
            try PrivateFile.write(authority.key.pem, to: keyFile)
        }
        // The receipt signer came later: a data directory made before it gets one on its next start.
        if let certificate = try? String(contentsOf: receiptFile, encoding: .utf8), let key = try? String(contentsOf: receiptKeyFile, encoding: .utf8) {
            authority.receiptCertificate = try Certificate.parsePEM(certificate)[0]
            authority.receiptKey = try PrivateKey(pem: key)
        } else {
            if authority.receiptCertificate == nil { try authority.makeReceiptSigner() }
            if let certificate = authority.receiptCertificate, let key = authority.receiptKey {
                try certificate.pem.write(to: receiptFile, atomically: true, encoding: .utf8)
                try PrivateFile.write(key.pem, to: receiptKeyFile)
            }
        }
        return authority
    }

    /// Signs receipt contents as Xcode does (BER, indefinite lengths, its receipt certificate).
    func signReceipt(_ payload: [UInt8]) throws -> [UInt8] {
        guard let receiptCertificate, let receiptKey else { throw StoreError.invalid("No Xcode receipt signer.") }
        return try SignedData.signIndefinite(payload: payload, key: receiptKey, certificate: receiptCertificate)
    }

    /// Signs a payload as Xcode does: `{"alg":"ES256","kid":"Apple_Xcode_Key","typ":"JWT","x5c":[the certificate]}`.
    func sign(_ payload: [UInt8]) throws -> String {
        try JWS.sign(payload: payload, key: key, chain: [certificate], keyId: Self.keyId)
    }
}
