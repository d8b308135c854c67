import AppStoreCrypto
import AppStoreModels
import Foundation

/// Xcode's StoreKit Testing signs with one self-signed certificate, `CN=StoreKit Testing in Xcode` (EC P-256,
/// CA:TRUE), `kid` `Apple_Xcode_Key`, and the payloads say `environment` `Xcode`. The emulator makes its own
/// certificate of that shape (Apple's key is Xcode's), so a backend can check that it refuses such data (its
/// chain is one certificate, not Apple's three), or that it accepts it only when configured to.
public struct XcodeAuthority: Sendable {
    public let certificate: Certificate
    public let key: PrivateKey
    /// The `kid` Xcode puts in its JWS headers.
    public static let keyId = "Apple_Xcode_Key"

    /// A fresh certificate valid 2000–2099.
    public static func generate() throws -> XcodeAuthority {
        let key = try PrivateKey.generateEC(curve: "P-256")
        let certificate = try CertificateBuilder(
            subject: [("CN", "StoreKit Testing in Xcode")], serial: UInt64.random(in: 1...UInt64(1) << 48),
            notBefore: Date(timeIntervalSince1970: 946_684_800), notAfter: Date(timeIntervalSince1970: 4_102_444_799), isCertificateAuthority: true
        ).issue(for: key, issuer: nil, issuerKey: key)
        return XcodeAuthority(certificate: certificate, key: key)
    }

    /// Loads it from `directory` (`xcode.pem`, `xcode-key.pem`), making and saving it on first use.
    public static func loadOrCreate(in directory: URL) throws -> XcodeAuthority {
        let certificateFile = directory.appendingPathComponent("xcode.pem"), keyFile = directory.appendingPathComponent("xcode-key.pem")
        if let certificate = try? String(contentsOf: certificateFile, encoding: .utf8), let key = try? String(contentsOf: keyFile, encoding: .utf8) {
            return XcodeAuthority(certificate: try Certificate.parsePEM(certificate)[0], key: try PrivateKey(pem: key))
        }
        let authority = try generate()
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try authority.certificate.pem.write(to: certificateFile, atomically: true, encoding: .utf8)
        try PrivateFile.write(authority.key.pem, to: keyFile)
        return authority
    }

    /// Signs a payload as Xcode does: `{"alg":"ES256","kid":"Apple_Xcode_Key","typ":"JWT","x5c":[the certificate]}`.
    func sign(_ payload: [UInt8]) throws -> String {
        try JWS.sign(payload: payload, key: key, chain: [certificate], keyId: Self.keyId)
    }
}
