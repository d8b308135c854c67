import AppStoreModels
import Foundation

/// An iOS 6 style transaction receipt (`SKPaymentTransaction.transactionReceipt`): an old-style
/// plist text whose `purchase-info` is signed by a version byte, an RSA signature and a certificate.
public struct LegacyTransactionReceipt: Sendable {
    /// The outer dictionary (`signature`, `purchase-info`, `environment`, `pod`, `signing-status`).
    public let outer: [String: String]
    /// The decoded `purchase-info` dictionary with Apple's hyphenated keys.
    public let purchaseInfo: [String: String]
    /// The exact `purchase-info` bytes that were signed.
    public let purchaseInfoBytes: [UInt8]
    /// Signature version byte (2 or 3).
    public let signatureVersion: UInt8
    /// RSA signature.
    public let signature: [UInt8]
    /// The embedded signing certificate (DER).
    public let certificate: [UInt8]

    /// Parses the receipt bytes (the Base64-decoded `receipt-data`).
    public init(bytes: [UInt8]) throws {
        guard let text = String(validUTF8: bytes) else { throw CryptoError("malformed_receipt", "not a text receipt") }
        let outer = try LegacyTransactionReceipt.parseDictionary(text)
        guard let infoBase64 = outer["purchase-info"], let info = Data(base64Encoded: infoBase64),
              let signatureBase64 = outer["signature"], let signatureBlob = Data(base64Encoded: signatureBase64) else {
            throw CryptoError("malformed_receipt", "purchase-info or signature missing")
        }
        guard let infoText = String(data: info, encoding: .utf8) else { throw CryptoError("malformed_receipt", "purchase-info is not text") }
        self.outer = outer
        purchaseInfo = try LegacyTransactionReceipt.parseDictionary(infoText)
        purchaseInfoBytes = Array(info)
        let blob = Array(signatureBlob)
        guard let version = blob.first, version == 2 || version == 3 else { throw CryptoError("malformed_receipt", "unknown signature version") }
        let signatureLength = version == 2 ? 128 : 256
        guard blob.count > 1 + signatureLength + 4 else { throw CryptoError("malformed_receipt", "signature blob too short") }
        signatureVersion = version
        signature = Array(blob[1..<(1 + signatureLength)])
        let lengthBytes = blob[(1 + signatureLength)..<(1 + signatureLength + 4)]
        let certificateLength = lengthBytes.reduce(0) { ($0 << 8) | Int($1) }
        let start = 1 + signatureLength + 4
        guard blob.count >= start + certificateLength else { throw CryptoError("malformed_receipt", "certificate truncated") }
        certificate = Array(blob[start..<(start + certificateLength)])
    }

    /// Whether bytes look like a text receipt rather than PKCS#7.
    public static func looksLikeLegacy(_ bytes: [UInt8]) -> Bool {
        bytes.first { $0 != 0x20 && $0 != 0x0a && $0 != 0x0d && $0 != 0x09 } == UInt8(ascii: "{")
    }

    /// The environment the receipt names (absent means Production).
    public var environment: AppStoreEnvironment {
        outer["environment"].flatMap(AppStoreEnvironment.init(loose:)) ?? .production
    }

    /// The purchase date, for validating the certificate at signing time.
    public var purchaseDate: Date? {
        purchaseInfo["purchase-date-ms"].flatMap(Int64.init).map(ReceiptDate.date(milliseconds:))
    }

    /// Checks the RSA signature over version byte ‖ purchase-info and the certificate chain at the purchase date.
    public func verify(with verifier: ChainVerifier, intermediates: [Certificate] = []) throws {
        let leaf = try Certificate(der: certificate)
        guard let key = leaf.publicKey else { throw CryptoError("invalid_certificate", "receipt certificate has no key") }
        let signed = [signatureVersion] + purchaseInfoBytes
        guard key.isValidSignature(signature, for: signed, digest: .sha1) || key.isValidSignature(signature, for: signed, digest: .sha256) else {
            throw CryptoError("signature_mismatch", "the transaction receipt signature is invalid")
        }
        try verifier.verify(leaf: leaf, intermediates: intermediates, at: purchaseDate ?? Date(), policy: .appleTransactionReceiptSigning)
    }

    /// verifyReceipt's JSON rendering: hyphens become underscores, values stay strings.
    public var receiptJSON: [String: String] {
        var result: [String: String] = [:]
        for (key, value) in purchaseInfo { result[key.replacingOccurrences(of: "-", with: "_")] = value }
        return result
    }

    /// Builds and signs a receipt (signature version 3, SHA-1 as Apple's were) with `key` and `certificate`.
    public static func make(purchaseInfo: [(String, String)], environment: AppStoreEnvironment, key: PrivateKey, certificate: Certificate) throws -> [UInt8] {
        let infoText = formatDictionary(purchaseInfo)
        let infoBytes = Array(infoText.utf8)
        let version: UInt8 = 3
        let signature = try key.sign([version] + infoBytes, digest: .sha1)
        let length = certificate.der.count
        let blob = [version] + signature + [UInt8(length >> 24 & 0xff), UInt8(length >> 16 & 0xff), UInt8(length >> 8 & 0xff), UInt8(length & 0xff)] + certificate.der
        var outer: [(String, String)] = [
            ("signature", Data(blob).base64EncodedString()),
            ("purchase-info", Data(infoBytes).base64EncodedString()),
        ]
        if environment == .sandbox { outer.append(("environment", "Sandbox")) }
        outer.append(("pod", "100"))
        outer.append(("signing-status", "0"))
        return Array(formatDictionary(outer).utf8)
    }

    static func formatDictionary(_ pairs: [(String, String)]) -> String {
        "{\n" + pairs.map { "\t\"\($0.0)\" = \"\($0.1)\";\n" }.joined() + "}"
    }

    /// Parses `{ "key" = "value"; … }`.
    static func parseDictionary(_ text: String) throws -> [String: String] {
        var result: [String: String] = [:]
        var scalars = Substring(text).unicodeScalars[...]
        func skipSpace() { while let first = scalars.first, first.properties.isWhitespace { scalars.removeFirst() } }
        func quoted() throws -> String {
            guard scalars.first == "\"" else { throw CryptoError("malformed_receipt", "expected a quoted string") }
            scalars.removeFirst()
            var value = String.UnicodeScalarView()
            while let scalar = scalars.first {
                scalars.removeFirst()
                if scalar == "\\", let next = scalars.first {
                    scalars.removeFirst()
                    value.append(next)
                } else if scalar == "\"" {
                    return String(value)
                } else {
                    value.append(scalar)
                }
            }
            throw CryptoError("malformed_receipt", "unterminated string")
        }
        skipSpace()
        guard scalars.first == "{" else { throw CryptoError("malformed_receipt", "expected '{'") }
        scalars.removeFirst()
        while true {
            skipSpace()
            if scalars.first == "}" { break }
            let key = try quoted()
            skipSpace()
            guard scalars.first == "=" else { throw CryptoError("malformed_receipt", "expected '='") }
            scalars.removeFirst()
            skipSpace()
            let value = try quoted()
            skipSpace()
            guard scalars.first == ";" else { throw CryptoError("malformed_receipt", "expected ';'") }
            scalars.removeFirst()
            result[key] = value
        }
        return result
    }
}
