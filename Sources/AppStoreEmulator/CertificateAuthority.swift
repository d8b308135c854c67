import AppStoreCrypto
import Foundation

/// The emulator's signing chain, shaped like Apple's: root → intermediate (OID 1.2.840.113635.100.6.2.1)
/// → receipt-signing leaf (OID 1.2.840.113635.100.6.11.1). Generated once and kept as PEM files.
/// Like Apple, the emulator has two: RSA for receipts, ECC P-256 for StoreKit 2 JWS (Apple Root CA - G3's role).
public struct CertificateAuthority: Sendable {
    /// The key type of a chain.
    public enum Algorithm: Sendable {
        /// RSA 2048, for PKCS#7 receipts.
        case rsa
        /// ECDSA P-256, for ES256 JWS.
        case ecP256

        func generateKey() throws -> PrivateKey {
            switch self {
            case .rsa: return try PrivateKey.generateRSA()
            case .ecP256: return try PrivateKey.generateEC(curve: "P-256")
            }
        }
    }

    public let root: Certificate
    public let intermediate: Certificate
    public let leaf: Certificate
    public let leafKey: PrivateKey
    /// The leaf's public key, kept to check our own receipts quickly.
    public let leafPublicKey: PublicKey

    /// The chain in receipt order (leaf first).
    public var chain: [Certificate] { [leaf, intermediate, root] }

    /// Loads the chain from `directory`, generating and saving it on first use.
    public static func loadOrCreate(in directory: URL, algorithm: Algorithm = .rsa) throws -> CertificateAuthority {
        let files = ["root.pem", "intermediate.pem", "leaf.pem", "leaf-key.pem"].map { directory.appendingPathComponent($0) }
        if files.allSatisfy({ FileManager.default.fileExists(atPath: $0.path) }) {
            let texts = try files.map { try String(contentsOf: $0, encoding: .utf8) }
            return try CertificateAuthority(root: Certificate.parsePEM(texts[0])[0], intermediate: Certificate.parsePEM(texts[1])[0],
                                            leaf: Certificate.parsePEM(texts[2])[0], leafKey: PrivateKey(pem: texts[3]))
        }
        let authority = try generate(algorithm: algorithm)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let rootKeyless = [authority.root.pem, authority.intermediate.pem, authority.leaf.pem, authority.leafKey.pem]
        for (file, text) in zip(files, rootKeyless) {
            try text.write(to: file, atomically: true, encoding: .utf8)
        }
        try? FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: files[3].path)
        return authority
    }

    init(root: Certificate, intermediate: Certificate, leaf: Certificate, leafKey: PrivateKey) throws {
        self.root = root
        self.intermediate = intermediate
        self.leaf = leaf
        self.leafKey = leafKey
        guard let publicKey = leaf.publicKey else { throw CryptoError("invalid_certificate", "leaf has no key") }
        leafPublicKey = publicKey
    }

    /// Generates a fresh chain valid 2000–2099 so any emulated date validates.
    public static func generate(algorithm: Algorithm = .rsa) throws -> CertificateAuthority {
        let suffix = algorithm == .ecP256 ? " - G3" : ""
        let start = Date(timeIntervalSince1970: 946_684_800)  // 2000-01-01
        let end = Date(timeIntervalSince1970: 4_102_444_799)  // 2099-12-31
        let serialBase = UInt64.random(in: 1...UInt64(1) << 48)
        let rootKey = try algorithm.generateKey()
        let root = try CertificateBuilder(
            subject: [("C", "US"), ("O", "Storekeeper"), ("OU", "Storekeeper Certification Authority"), ("CN", "Storekeeper Emulator Root CA" + suffix)],
            serial: serialBase, notBefore: start, notAfter: end, isCertificateAuthority: true
        ).issue(for: rootKey, issuer: nil, issuerKey: rootKey)
        let intermediateKey = try algorithm.generateKey()
        let intermediate = try CertificateBuilder(
            subject: [("C", "US"), ("O", "Storekeeper"), ("OU", algorithm == .ecP256 ? "G6" : "G5"), ("CN", "Storekeeper Worldwide Developer Relations Certification Auth")],
            serial: serialBase + 1, notBefore: start, notAfter: end, isCertificateAuthority: true, pathLength: 0,
            markerExtensions: [OID.appleWWDRIntermediate]
        ).issue(for: intermediateKey, issuer: root, issuerKey: rootKey)
        let leafKey = try algorithm.generateKey()
        let leaf = try CertificateBuilder(
            subject: [("C", "US"), ("O", "Storekeeper"), ("OU", "Storekeeper Emulator Worldwide Developer Relations"), ("CN", (algorithm == .ecP256 ? "Prod ECC " : "") + "Storekeeper Emulator Receipt Signing")],
            serial: serialBase + 2, notBefore: start, notAfter: end, isCertificateAuthority: false,
            markerExtensions: [OID.appleReceiptSigner]
        ).issue(for: leafKey, issuer: intermediate, issuerKey: intermediateKey)
        return try CertificateAuthority(root: root, intermediate: intermediate, leaf: leaf, leafKey: leafKey)
    }
}
