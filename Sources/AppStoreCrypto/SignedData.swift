import AppStoreModels
import Foundation

/// A PKCS#7/CMS SignedData container as App Store receipts use it: the payload, embedded
/// certificates and one signer identified by issuer and serial number.
public struct SignedData: Sendable, Equatable {
    /// The signed content (the receipt payload).
    public let payload: [UInt8]
    /// Embedded certificates in the order they appear.
    public let certificates: [[UInt8]]
    /// The signer's issuer name (DER) and serial number (INTEGER content bytes).
    public let signerIssuer: [UInt8]
    public let signerSerial: [UInt8]
    /// The digest algorithm of the signer.
    public let digest: Digest
    /// The signature bytes.
    public let signature: [UInt8]
    /// The DER of the signed attributes re-tagged as SET, when the signer has any.
    public let signedAttributes: [UInt8]?
    /// The messageDigest attribute value, when present.
    public let messageDigest: [UInt8]?

    /// The most embedded certificates accepted before any of them is parsed.
    public static let maximumCertificates = 8

    /// Parses BER or DER. Throws `CryptoError` with code `malformed_pkcs7`.
    public init(ber bytes: [UInt8]) throws {
        if let parsed = SignedData.parseDER(bytes) {
            self = parsed
        } else {
            try self.init(generalBER: bytes)
        }
    }

    /// The general parser, which reads every form `init(ber:)` accepts and names what is wrong.
    package init(generalBER bytes: [UInt8]) throws {
        do {
            let contentInfo = try ASN1Element.parse(bytes).children(expecting: DER.Tag.sequence, "ContentInfo")
            guard contentInfo.count >= 2, try contentInfo[0].objectIdentifier() == OID.signedData else {
                throw ASN1Error("not a SignedData ContentInfo")
            }
            guard let signedDataElement = try contentInfo[1].children(expecting: 0xa0, "content").first else {
                throw ASN1Error("empty content")
            }
            let fields = try signedDataElement.children(expecting: DER.Tag.sequence, "SignedData")
            guard fields.count >= 4 else { throw ASN1Error("SignedData too short") }
            let encapsulated = try fields[2].children(expecting: DER.Tag.sequence, "encapContentInfo")
            guard encapsulated.count == 2, let wrapped = try encapsulated[1].children(expecting: 0xa0, "eContent").first else {
                throw ASN1Error("SignedData has no content")
            }
            var content = try wrapped.octets()
            // Xcode double-wraps the payload in a second OCTET STRING.
            if content.first == DER.Tag.octetString || content.first == 0x24,
               let inner = try? ASN1Element.parse(content), let octets = try? inner.octets() {
                content = octets
            }
            payload = content
            var certificates: [[UInt8]] = []
            var signerInfos: ASN1Element?
            for field in fields.dropFirst(3) {
                switch field.tag {
                case 0xa0:
                    let embedded = try field.children()
                    // Apple embeds three (leaf, WWDR, root); more is not a receipt, and each one costs a parse.
                    guard embedded.count <= SignedData.maximumCertificates else { throw ASN1Error("too many certificates") }
                    certificates = embedded.map { Array($0.encoded) }
                case 0xa1: continue
                case DER.Tag.set: signerInfos = field
                default: throw ASN1Error("unexpected SignedData field")
                }
            }
            self.certificates = certificates
            guard let signerInfos, let signer = try signerInfos.children().first else { throw ASN1Error("no signer") }
            let info = try signer.children(expecting: DER.Tag.sequence, "SignerInfo")
            guard info.count >= 5 else { throw ASN1Error("SignerInfo too short") }
            let identifier = try info[1].children(expecting: DER.Tag.sequence, "IssuerAndSerialNumber")
            guard identifier.count == 2 else { throw ASN1Error("signer is not identified by issuer and serial") }
            signerIssuer = Array(identifier[0].encoded)
            signerSerial = Array(identifier[1].content)
            guard let digestOID = try info[2].children().first?.objectIdentifier(), let digest = Digest(oid: digestOID) else {
                throw CryptoError("unsupported_digest", "only SHA-1 and SHA-256 receipts are supported")
            }
            self.digest = digest
            var index = 3
            if info[index].tag == 0xa0 {
                var retagged = Array(info[index].encoded)
                retagged[0] = DER.Tag.set
                signedAttributes = retagged
                var found: [UInt8]?
                for attribute in try info[index].children() {
                    let parts = try attribute.children()
                    if parts.count == 2, try parts[0].objectIdentifier() == OID.messageDigest {
                        found = try parts[1].children().first?.octets()
                    }
                }
                messageDigest = found
                index += 1
            } else {
                signedAttributes = nil
                messageDigest = nil
            }
            guard info.count > index + 1 else { throw ASN1Error("SignerInfo has no signature") }
            signature = try info[index + 1].octets()
        } catch let error as ASN1Error {
            throw CryptoError("malformed_pkcs7", "not a PKCS#7 receipt: \(error.description)")
        }
    }

    /// Builds DER SignedData over `payload`, signed RSA with `digest` and no signed attributes,
    /// embedding `chain` (leaf first), exactly as the App Store lays out receipts.
    public static func sign(payload: [UInt8], key: PrivateKey, chain: [Certificate], digest: Digest = .sha256) throws -> [UInt8] {
        guard let leaf = chain.first else { throw CryptoError("signing_failed", "no signing certificate") }
        let algorithm = DER.sequence([DER.objectIdentifier(digest.oid), DER.null])
        let signerInfo = try signerInfo(payload, key: key, signer: leaf, digest: digest, signatureAlgorithm: OID.rsaEncryption)
        let signedData = DER.sequence([
            DER.integer(1),
            DER.tlv(DER.Tag.set, algorithm),
            DER.sequence([DER.objectIdentifier(OID.data), DER.explicit(0, DER.octetString(payload))]),
            DER.tlv(0xa0, chain.flatMap(\.der)),
            DER.tlv(DER.Tag.set, signerInfo),
        ])
        return DER.sequence([DER.objectIdentifier(OID.signedData), DER.explicit(0, signedData)])
    }

    /// The SignerInfo of an RSA signature over `payload` without signed attributes, naming the signer by issuer and serial.
    private static func signerInfo(_ payload: [UInt8], key: PrivateKey, signer: Certificate, digest: Digest,
                                   signatureAlgorithm: String) throws -> [UInt8] {
        let fields = try signer.fields
        return DER.sequence([
            DER.integer(1),
            DER.sequence([fields.issuer, DER.tlv(DER.Tag.integer, fields.serial)]),
            DER.sequence([DER.objectIdentifier(digest.oid), DER.null]),
            DER.sequence([DER.objectIdentifier(signatureAlgorithm), DER.null]),
            DER.octetString(try key.sign(payload, digest: digest)),
        ])
    }

    /// Builds SignedData as Xcode's StoreKit Testing lays receipts out: BER with indefinite lengths, the payload
    /// inside a constructed OCTET STRING, one (self-signed) certificate, and `sha256WithRSAEncryption` named as
    /// the signature algorithm. Parsers that assume DER fail on it, as they do on Xcode's own receipts.
    public static func signIndefinite(payload: [UInt8], key: PrivateKey, certificate: Certificate) throws -> [UInt8] {
        let digest = DER.sequence([DER.objectIdentifier(OID.sha256), DER.null])
        let signerInfo = try signerInfo(payload, key: key, signer: certificate, digest: .sha256, signatureAlgorithm: OID.sha256WithRSA)
        // 0x80 opens an indefinite length; two zero bytes (end of contents) close it.
        func indefinite(_ tag: UInt8, _ parts: [[UInt8]]) -> [UInt8] { [tag, 0x80] + parts.flatMap { $0 } + [0, 0] }
        let content = indefinite(0x30, [
            DER.objectIdentifier(OID.data),
            indefinite(0xa0, [indefinite(0x24, [DER.octetString(payload)])]),
        ])
        let signedData = indefinite(0x30, [
            DER.integer(1),
            DER.tlv(DER.Tag.set, digest),
            content,
            DER.tlv(0xa0, certificate.der),
            DER.tlv(DER.Tag.set, signerInfo),
        ])
        return indefinite(0x30, [DER.objectIdentifier(OID.signedData), indefinite(0xa0, [signedData])])
    }

    /// The embedded certificate that signed, found by issuer and serial.
    public func signerCertificate() throws -> Certificate {
        for der in certificates {
            guard let certificate = try? Certificate(der: der), let fields = try? certificate.fields else { continue }
            if fields.issuer == signerIssuer && fields.serial == signerSerial { return certificate }
        }
        throw CryptoError("signer_not_found", "no embedded certificate matches the signer")
    }

    /// Checks the signature (and the messageDigest attribute, if any) with `certificate`'s key.
    public func verifySignature(with certificate: Certificate) throws {
        guard let key = certificate.publicKey else { throw CryptoError("invalid_certificate", "signer has no usable key") }
        try verifySignature(with: key)
    }

    /// Checks the signature with a public key.
    public func verifySignature(with key: PublicKey) throws {
        if let signedAttributes {
            guard messageDigest == digest.hash(payload) else { throw CryptoError("signature_mismatch", "the payload digest does not match") }
            guard key.isValidSignature(signature, for: signedAttributes, digest: digest) else {
                throw CryptoError("signature_mismatch", "the receipt signature is invalid")
            }
        } else {
            guard key.isValidSignature(signature, for: payload, digest: digest) else {
                throw CryptoError("signature_mismatch", "the receipt signature is invalid")
            }
        }
    }

    /// Full verification: signer certificate found, signature valid, chain valid at `date` under the policy.
    /// Returns the signer certificate.
    @discardableResult
    public func verify(with verifier: ChainVerifier, at date: Date, policy: ChainVerifier.Policy = .appleReceiptSigning) throws -> Certificate {
        let signer = try signerCertificate()
        try verifySignature(with: signer)
        let others = certificates.filter { !$0.hasSameBytes(as: signer.der) }.compactMap { try? Certificate(der: $0) }
        try verifier.verify(leaf: signer, intermediates: others, at: date, policy: policy)
        return signer
    }
}
