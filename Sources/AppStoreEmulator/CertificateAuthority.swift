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
    /// The keys that sign OCSP answers about the intermediate (the root's) and the leaf (the intermediate's).
    /// Chains saved before the emulator answered OCSP have none.
    public let rootKey: PrivateKey?
    public let intermediateKey: PrivateKey?

    /// Where the JWS chain's certificates say their status is answered (Apple's responder host, reached
    /// through the emulator's proxy; the path tells the two certificates apart, as Apple's do).
    public static let ocspURLs = (intermediate: "https://ocsp.apple.com/ocsp03-storekeeper-rootg3",
                                  leaf: "https://ocsp.apple.com/ocsp03-storekeeper-wwdrg6")
    static let authorityInfoAccessOID = "1.3.6.1.5.5.7.1.1"

    /// The responder for this chain's intermediate and leaf, when the signing keys are at hand.
    public var ocspResponder: OCSPResponder? {
        guard let rootKey, let intermediateKey else { return nil }
        return OCSPResponder(issued: [.init(certificate: intermediate, issuer: root, issuerKey: rootKey),
                                      .init(certificate: leaf, issuer: intermediate, issuerKey: intermediateKey)])
    }

    /// The chain in receipt order (leaf first).
    public var chain: [Certificate] { [leaf, intermediate, root] }

    /// Loads the chain from `directory`, generating and saving it on first use.
    ///
    /// A JWS chain saved before the emulator answered OCSP (no responder named, no signing keys) is issued
    /// again, so online checks can work; its old root is then no longer the one to trust.
    public static func loadOrCreate(in directory: URL, algorithm: Algorithm = .rsa) throws -> CertificateAuthority {
        let names = ["root.pem", "intermediate.pem", "leaf.pem", "leaf-key.pem", "root-key.pem", "intermediate-key.pem"]
        let files = names.map { directory.appendingPathComponent($0) }
        let exists = files.map { FileManager.default.fileExists(atPath: $0.path) }
        if exists.prefix(4).allSatisfy({ $0 }) {
            let texts = try files.prefix(4).map { try String(contentsOf: $0, encoding: .utf8) }
            let keys = try files.suffix(2).enumerated().map { index, file in
                exists[4 + index] ? try PrivateKey(pem: String(contentsOf: file, encoding: .utf8)) : nil
            }
            let loaded = try CertificateAuthority(root: Certificate.parsePEM(texts[0])[0], intermediate: Certificate.parsePEM(texts[1])[0],
                                                  leaf: Certificate.parsePEM(texts[2])[0], leafKey: PrivateKey(pem: texts[3]),
                                                  rootKey: keys[0], intermediateKey: keys[1])
            let answersOCSP = loaded.ocspResponder != nil && loaded.leaf.hasExtension(authorityInfoAccessOID)
            if algorithm == .rsa || answersOCSP { return loaded }
            FileHandle.standardError.write(Data("storekeeper: issuing the JWS chain in \(directory.path) again, now with an OCSP responder; trust its new root (appstore ca export --jws)\n".utf8))
        }
        let authority = try generate(algorithm: algorithm)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let texts = [authority.root.pem, authority.intermediate.pem, authority.leaf.pem, authority.leafKey.pem,
                     authority.rootKey?.pem ?? "", authority.intermediateKey?.pem ?? ""]
        for (index, (file, text)) in zip(files, texts).enumerated() {
            if index >= 3 { try PrivateFile.write(text, to: file) } else { try text.write(to: file, atomically: true, encoding: .utf8) }
        }
        return authority
    }

    init(root: Certificate, intermediate: Certificate, leaf: Certificate, leafKey: PrivateKey,
         rootKey: PrivateKey? = nil, intermediateKey: PrivateKey? = nil) throws {
        self.root = root
        self.intermediate = intermediate
        self.leaf = leaf
        self.leafKey = leafKey
        self.rootKey = rootKey
        self.intermediateKey = intermediateKey
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
        // Apple's G3 chain names its OCSP responder in both certificates below the root; online checks follow it.
        func ocsp(_ url: String) -> [(String, String)] { algorithm == .ecP256 ? [("authorityInfoAccess", "OCSP;URI:" + url)] : [] }
        let intermediateKey = try algorithm.generateKey()
        var intermediateBuilder = CertificateBuilder(
            subject: [("C", "US"), ("O", "Storekeeper"), ("OU", algorithm == .ecP256 ? "G6" : "G5"), ("CN", "Storekeeper Worldwide Developer Relations Certification Auth")],
            serial: serialBase + 1, notBefore: start, notAfter: end, isCertificateAuthority: true, pathLength: 0,
            markerExtensions: [OID.appleWWDRIntermediate]
        )
        intermediateBuilder.extensions = ocsp(ocspURLs.intermediate)
        let intermediate = try intermediateBuilder.issue(for: intermediateKey, issuer: root, issuerKey: rootKey)
        let leafKey = try algorithm.generateKey()
        var leafBuilder = CertificateBuilder(
            subject: [("C", "US"), ("O", "Storekeeper"), ("OU", "Storekeeper Emulator Worldwide Developer Relations"), ("CN", (algorithm == .ecP256 ? "Prod ECC " : "") + "Storekeeper Emulator Receipt Signing")],
            serial: serialBase + 2, notBefore: start, notAfter: end, isCertificateAuthority: false,
            markerExtensions: [OID.appleReceiptSigner]
        )
        leafBuilder.extensions = ocsp(ocspURLs.leaf)
        let leaf = try leafBuilder.issue(for: leafKey, issuer: intermediate, issuerKey: intermediateKey)
        return try CertificateAuthority(root: root, intermediate: intermediate, leaf: leaf, leafKey: leafKey,
                                        rootKey: rootKey, intermediateKey: intermediateKey)
    }
}
