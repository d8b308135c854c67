/// The fast path of `SignedData.init(ber:)` for SignedData in plain DER whose signer has no signed attributes, as the App
/// Store and the emulator lay receipts out: one pass with `DERCursor` and object identifiers compared as bytes, where
/// the general parser builds an array of elements for every constructed one and a dotted string for every identifier.
/// Anything else (BER, Xcode's double-wrapped payload, signed attributes, more than one signer, a digest other than
/// SHA-1 or SHA-256, truncation) gives nil and the general parser reads the bytes, with its own errors: the fast path
/// never decides that a receipt is bad, and what it does read it reads as the general parser does.
extension SignedData {
    /// Object identifiers' content octets (their dotted forms are in `OID`).
    private static let signedDataIdentifier = identifierContent(OID.signedData)
    private static let digestIdentifiers: [(content: [UInt8], digest: Digest)] = [
        (identifierContent(OID.sha256), .sha256), (identifierContent(OID.sha256WithRSA), .sha256),
        (identifierContent(OID.sha1), .sha1), (identifierContent(OID.sha1WithRSA), .sha1),
    ]

    private static func identifierContent(_ dotted: String) -> [UInt8] {
        // Every identifier here is shorter than 128 bytes: one identifier octet and one length octet.
        Array(DER.objectIdentifier(dotted).dropFirst(2))
    }

    /// A cursor over the fields of the SignedData that a ContentInfo in `buffer` wraps, or nil where the fast path stops.
    private static func signedDataFields(_ buffer: UnsafeBufferPointer<UInt8>) -> DERCursor? {
        var outer = DERCursor(bytes: buffer)
        guard let contentInfo = outer.next(tagged: DER.Tag.sequence), outer.isAtEnd else { return nil }
        var info = outer.children(of: contentInfo)
        guard let type = info.next(tagged: DER.Tag.objectIdentifier), info.content(of: type, equals: signedDataIdentifier),
              let explicit = info.next(tagged: 0xa0), info.isAtEnd else { return nil }
        var wrapper = info.children(of: explicit)
        guard let signedData = wrapper.next(tagged: DER.Tag.sequence), wrapper.isAtEnd else { return nil }
        return wrapper.children(of: signedData)
    }

    /// Where a PKCS#7 SignedData's certificates field (`[0] IMPLICIT`, its identifier and length included) lies in its
    /// DER, or nil when it has none, its length is not in its shortest form, or the bytes are not laid out as the App
    /// Store lays receipts out. Reads only the elements' headers up to that field: it says where the certificates are,
    /// not whether they or the rest are valid.
    public static func certificatesRange(inDER bytes: [UInt8]) -> Range<Int>? {
        bytes.withUnsafeBufferPointer { buffer -> Range<Int>? in
            guard var fields = signedDataFields(buffer) else { return nil }
            guard fields.next() != nil, fields.next() != nil, fields.next(tagged: DER.Tag.sequence) != nil,
                  let certificates = fields.next(tagged: 0xa0) else { return nil }
            // Its length in the fewest bytes, as DER writes it (the cursor also reads longer forms).
            let length = certificates.end - certificates.start
            let lengthBytes = length < 0x80 ? 0 : length < 0x100 ? 1 : length < 0x10000 ? 2 : 3
            guard certificates.start - certificates.headerStart == 2 + lengthBytes else { return nil }
            return certificates.headerStart..<certificates.end
        }
    }

    /// The SignedData read in one DER pass, or nil to have the general parser read it.
    package static func parseDER(_ bytes: [UInt8]) -> SignedData? {
        bytes.withUnsafeBufferPointer { buffer -> SignedData? in
            let outer = DERCursor(bytes: buffer)
            guard var fields = signedDataFields(buffer) else { return nil }
            guard fields.next() != nil, fields.next() != nil,  // the version and the digest algorithms, not read
                  let encapsulated = fields.next(tagged: DER.Tag.sequence) else { return nil }
            var encapsulatedFields = fields.children(of: encapsulated)
            guard encapsulatedFields.next() != nil, let explicitContent = encapsulatedFields.next(tagged: 0xa0),
                  encapsulatedFields.isAtEnd else { return nil }
            var wrappedContent = fields.children(of: explicitContent)
            guard let octets = wrappedContent.next(tagged: DER.Tag.octetString), wrappedContent.isAtEnd else { return nil }
            // A payload that is itself an OCTET STRING is Xcode's double wrap, which the general parser unwraps.
            if octets.start < octets.end, buffer[octets.start] == DER.Tag.octetString || buffer[octets.start] == 0x24 { return nil }

            var certificates: [[UInt8]] = []
            var signerInfos: DERElement?
            while !fields.isAtEnd {
                guard let field = fields.next() else { return nil }
                switch field.tag {
                case 0xa0:
                    var embedded = fields.children(of: field)
                    var found: [[UInt8]] = []
                    while !embedded.isAtEnd {
                        guard let certificate = embedded.next(), found.count < maximumCertificates else { return nil }
                        found.append(embedded.encoding(of: certificate))
                    }
                    certificates = found
                case 0xa1: continue
                case DER.Tag.set: signerInfos = field
                default: return nil
                }
            }
            guard let signerInfos else { return nil }
            var signers = fields.children(of: signerInfos)
            guard let signer = signers.next(tagged: DER.Tag.sequence), signers.isAtEnd else { return nil }

            var signerFields = signers.children(of: signer)
            guard signerFields.next() != nil, let identifier = signerFields.next(tagged: DER.Tag.sequence),
                  let digestAlgorithm = signerFields.next(), digestAlgorithm.isConstructed,
                  let signatureAlgorithm = signerFields.next(), signatureAlgorithm.tag != 0xa0,
                  let signature = signerFields.next(tagged: DER.Tag.octetString) else { return nil }
            while !signerFields.isAtEnd { guard signerFields.next() != nil else { return nil } }

            var identifierFields = signerFields.children(of: identifier)
            guard let issuer = identifierFields.next(), let serial = identifierFields.next(), identifierFields.isAtEnd else { return nil }

            var algorithm = signerFields.children(of: digestAlgorithm)
            guard let digestIdentifier = algorithm.next(tagged: DER.Tag.objectIdentifier),
                  let digest = digestIdentifiers.first(where: { algorithm.content(of: digestIdentifier, equals: $0.content) })?.digest
            else { return nil }
            while !algorithm.isAtEnd { guard algorithm.next() != nil else { return nil } }

            return SignedData(payload: outer.content(of: octets), certificates: certificates,
                              signerIssuer: outer.encoding(of: issuer), signerSerial: outer.content(of: serial), digest: digest,
                              signature: outer.content(of: signature), signedAttributes: nil, messageDigest: nil)
        }
    }

    fileprivate init(payload: [UInt8], certificates: [[UInt8]], signerIssuer: [UInt8], signerSerial: [UInt8], digest: Digest,
                     signature: [UInt8], signedAttributes: [UInt8]?, messageDigest: [UInt8]?) {
        self.payload = payload
        self.certificates = certificates
        self.signerIssuer = signerIssuer
        self.signerSerial = signerSerial
        self.digest = digest
        self.signature = signature
        self.signedAttributes = signedAttributes
        self.messageDigest = messageDigest
    }
}
