import AppStoreModels
import COpenSSL
import Foundation

/// An owned X.509 certificate (`X509`) with its DER bytes.
// Immutable after creation; OpenSSL permits concurrent read-only use of an X509.
public final class Certificate: @unchecked Sendable {
    let pointer: OpaquePointer
    /// The DER encoding.
    public let der: [UInt8]

    /// Parses a DER certificate.
    public init(der: [UInt8]) throws {
        var cursor: UnsafePointer<UInt8>?
        let parsed: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            cursor = buffer.baseAddress
            return d2i_X509(nil, &cursor, buffer.count)
        }
        guard let parsed else { throw CryptoError.openSSL("invalid_certificate", "not a DER X.509 certificate") }
        pointer = parsed
        self.der = der
    }

    /// Parses a certificate that must be exactly `der`: every byte consumed, and encoded back to the same bytes. A
    /// certificate spelled another way (bytes after it, lengths in a longer form) is refused, so two texts that verify
    /// are two certificates (a cache keyed by the text cannot be filled with spellings of one).
    public convenience init(exactDER der: [UInt8]) throws {
        try self.init(der: der)
        guard Self.encoded(pointer) == der else {
            throw CryptoError.openSSL("invalid_certificate", "the certificate is not in exact DER")
        }
    }

    /// The certificate's DER as OpenSSL encodes it; empty if it cannot.
    private static func encoded(_ pointer: OpaquePointer) -> [UInt8] {
        let length = i2d_X509(pointer, nil)
        guard length > 0 else { return [] }
        var bytes = [UInt8](repeating: 0, count: Int(length))
        bytes.withUnsafeMutableBufferPointer { buffer in
            var out = buffer.baseAddress
            _ = i2d_X509(pointer, &out)
        }
        return bytes
    }

    init(owning pointer: OpaquePointer) throws {
        self.pointer = pointer
        let bytes = Self.encoded(pointer)
        guard !bytes.isEmpty else { throw CryptoError.openSSL("invalid_certificate", "cannot encode certificate") }
        der = bytes
    }

    deinit { X509_free(pointer) }

    /// Every certificate in a PEM text, in order.
    public static func parsePEM(_ text: String) throws -> [Certificate] {
        var result: [Certificate] = []
        var remaining = Substring(text)
        while let begin = remaining.range(of: "-----BEGIN CERTIFICATE-----"),
              let end = remaining.range(of: "-----END CERTIFICATE-----", range: begin.upperBound..<remaining.endIndex) {
            let body = remaining[begin.upperBound..<end.lowerBound].filter { !$0.isWhitespace }
            guard let der = Data(base64Encoded: String(body)) else { throw CryptoError("invalid_certificate", "PEM body is not Base64") }
            result.append(try Certificate(der: Array(der)))
            remaining = remaining[end.upperBound...]
        }
        guard !result.isEmpty else { throw CryptoError("invalid_certificate", "no PEM certificate found") }
        return result
    }

    /// The certificate as PEM text.
    public var pem: String {
        let body = Data(der).base64EncodedString(options: [.lineLength64Characters, .endLineWithLineFeed])
        return "-----BEGIN CERTIFICATE-----\n\(body)\n-----END CERTIFICATE-----\n"
    }

    /// The subject public key.
    public var publicKey: PublicKey? {
        X509_get_pubkey(pointer).map(PublicKey.init(owning:))
    }

    /// Whether an extension with this dotted OID is present.
    public func hasExtension(_ oid: String) -> Bool { Self.hasExtension(pointer, oid) }

    /// Whether an OpenSSL certificate (one of a built chain) carries the extension `oid`.
    static func hasExtension(_ certificate: OpaquePointer, _ oid: String) -> Bool {
        guard let object = OBJ_txt2obj(oid, 1) else { return false }
        defer { ASN1_OBJECT_free(object) }
        return X509_get_ext_by_OBJ(certificate, object, -1) >= 0
    }

    /// The TBS fields we need without OpenSSL: issuer name DER, serial, subject name DER and validity.
    public var fields: Fields {
        get throws { try Fields(der: der) }
    }

    /// Identity and validity read from the DER.
    public struct Fields: Sendable {
        public let serial: [UInt8]
        public let issuer: [UInt8]
        public let subject: [UInt8]
        public let notBefore: Date
        public let notAfter: Date
        public let subjectCommonName: String?

        init(der: [UInt8]) throws {
            let certificate = try ASN1Element.parse(der).children(expecting: DER.Tag.sequence, "certificate")
            guard let tbsElement = certificate.first else { throw ASN1Error("certificate has no TBS") }
            var tbs = try tbsElement.children(expecting: DER.Tag.sequence, "tbsCertificate")
            if tbs.first?.tag == 0xa0 { tbs.removeFirst() }
            guard tbs.count >= 6 else { throw ASN1Error("tbsCertificate too short") }
            serial = Array(tbs[0].content)
            issuer = Array(tbs[2].encoded)
            let validity = try tbs[3].children(expecting: DER.Tag.sequence, "validity")
            guard validity.count == 2 else { throw ASN1Error("validity needs two times") }
            notBefore = try Fields.time(validity[0])
            notAfter = try Fields.time(validity[1])
            subject = Array(tbs[4].encoded)
            var commonName: String?
            for rdn in try tbs[4].children() {
                for attribute in try rdn.children() {
                    let parts = try attribute.children()
                    if parts.count == 2, try parts[0].objectIdentifier() == "2.5.4.3" { commonName = try? parts[1].string() }
                }
            }
            subjectCommonName = commonName
        }

        static func time(_ element: ASN1Element) throws -> Date {
            guard let text = String(validUTF8: element.content) else { throw ASN1Error("time is not text") }
            var full = text
            if element.tag == 0x17 {
                // UTCTime: YYMMDDHHMMSSZ, years 50–99 are 19xx.
                guard let year = Int(text.prefix(2)) else { throw ASN1Error("bad UTCTime") }
                full = (year >= 50 ? "19" : "20") + text
            } else if element.tag != 0x18 {
                throw ASN1Error("expected a time")
            }
            let digits = Array(full.utf8)
            guard digits.count >= 15 else { throw ASN1Error("time too short") }
            let iso = "\(String(full.prefix(4)))-\(full.dropFirst(4).prefix(2))-\(full.dropFirst(6).prefix(2))T\(full.dropFirst(8).prefix(2)):\(full.dropFirst(10).prefix(2)):\(full.dropFirst(12).prefix(2))Z"
            guard let date = ReceiptDate.parseRFC3339(iso) else { throw ASN1Error("bad time") }
            return date
        }
    }
}

extension CryptoError {
    init(_ code: String, _ message: String, _: Void = ()) { self.init(code, message) }
}
