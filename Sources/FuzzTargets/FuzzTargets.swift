import AppStoreCrypto
import AppStoreModels
import Foundation
import HTTP
import HTTPClient
import PurchaseServer

/// The inputs an attacker controls, one harness each: libFuzzer drives them in `make fuzz`
/// (`storekeeper-fuzz`), and `make test` replays every kept input (the seeds and each crash
/// ever found, minimised) through the same functions. A harness may throw; it must never trap.
public enum FuzzTargets {
    /// A harness: bytes in, nothing out but whether it survived.
    public typealias Harness = @Sendable ([UInt8]) -> Void

    /// Every harness by name (also the corpus directory name under `Tests/fuzz/`).
    public static let all: [String: Harness] = [
        "der": der,
        "receipt": receipt,
        "legacy-receipt": legacyReceipt,
        "jws": jws,
        "json": json,
        "catalog": catalog,
        "http-response": httpResponse,
        "http-request": httpRequest,
    ]

    /// BER/DER: every element, every child, every OCTET STRING, integer, string and OID read.
    static func der(_ bytes: [UInt8]) {
        guard let element = try? ASN1Element.parse(bytes) else { return }
        walk(element, budget: 10_000)
    }

    private static func walk(_ element: ASN1Element, budget: Int) {
        _ = try? element.octets()
        _ = try? element.integer()
        _ = try? element.string()
        _ = try? element.objectIdentifier()
        guard budget > 0, element.isConstructed, let children = try? element.children() else { return }
        for child in children.prefix(budget) { walk(child, budget: budget / max(children.count, 1) - 1) }
    }

    /// An app receipt: PKCS#7 and the receipt payload with its in-app purchases (the base64 text too).
    static func receipt(_ bytes: [UInt8]) {
        _ = try? ReceiptDecoder.decode(bytes)
        fastPathsAgree(bytes)
        if let text = String(validating: bytes, as: UTF8.self) {
            storedFormsAgree(text)
            if let decoded = ReceiptDecoder.base64Decode(text) {
                _ = try? ReceiptDecoder.decode(decoded)
                fastPathsAgree(decoded)
            }
        }
    }

    /// An upload stored without its certificates (`StoredReceipt`), the parts learnt from itself, gives back the same
    /// characters; one whose own alignment is compactable is compacted; any text read as a stored form does not trap.
    private static func storedFormsAgree(_ text: String) {
        let known = Dictionary(StoredReceipt.parts(of: text).map { (Digest.sha256.hash($0.utf8).hexString, $0) }) { first, _ in first }
        let (stored, digest) = StoredReceipt.compact(text) { part in
            let digest = Digest.sha256.hash(part).hexString
            return known[digest] == nil ? nil : digest
        }
        if digest != nil {
            precondition(StoredReceipt.expand(stored, part: { known[$0] }) == text, "a stored receipt expanded to other characters")
        } else {
            precondition(stored == text && StoredReceipt.sharedPart(of: Array(text.utf8)) == nil, "a compactable receipt was not compacted")
        }
        _ = StoredReceipt.expand(text) { _ in text }
    }

    /// The fast paths of the PKCS#7 container and of the payload read nothing the general parsers would not read the
    /// same way (a difference stops the fuzzer as a crash).
    private static func fastPathsAgree(_ bytes: [UInt8]) {
        if let fast = SignedData.parseDER(bytes) {
            precondition(fast == (try? SignedData(generalBER: bytes)), "the SignedData fast path read differently")
            if let payload = ReceiptPayload.decodeFast(fast.payload) {
                precondition(payload == (try? ReceiptPayload.decodeGeneral(fast.payload)), "the payload's fast path read differently")
            }
        }
    }

    /// The iOS 6 transaction receipt (an old-style plist with a signature blob).
    static func legacyReceipt(_ bytes: [UInt8]) {
        guard let receipt = try? LegacyTransactionReceipt(bytes: bytes) else { return }
        _ = receipt.receiptJSON
        _ = receipt.purchaseDate
        _ = receipt.environment
    }

    /// A compact JWS as StoreKit 2 and notifications carry it: header, x5c, payload, transaction fields, signature check.
    static func jws(_ bytes: [UInt8]) {
        guard let text = String(validating: bytes, as: UTF8.self) else { return }
        storedForm(text)
        guard let jws = try? JWS(compact: text) else { return }
        _ = try? jws.certificates()
        if let payload = try? jws.payloadJSON() { _ = JWSTransaction(json: payload) }
        if let verifier = roots { _ = try? jws.verify(with: verifier, at: Date(timeIntervalSince1970: 1_700_000_000)) }
    }

    /// The stored form of a JWS (`StoredJWS`): any text read as one never traps, and a text without `~` (as every JWS
    /// the server stores: Base64url has none) compacted with what its payload carries expands to the very same bytes
    /// (a difference stops the fuzzer as a crash).
    private static func storedForm(_ text: String) {
        _ = StoredJWS.headerDigests(of: text)
        _ = StoredJWS.expand(text, header: { $0.hasPrefix("0") ? nil : "e30" })
        var headers: [String: String] = [:]
        let digest = { (header: ArraySlice<UInt8>) -> String? in
            let digest = Digest.sha256.hash(header).hexString
            headers[digest] = String(decoding: header, as: UTF8.self)
            return digest
        }
        guard !text.utf8.contains(UInt8(ascii: "~")) else { return }
        let data = (try? JWS(compact: text).payloadJSON())?["data"]
        let carried = ["signedTransactionInfo", "signedRenewalInfo", "bundleId"].compactMap { data?[$0]?.text }
        let stored = StoredJWS.compact(text, carried: carried, digest: digest)
        precondition(StoredJWS.expand(stored, header: { headers[$0] }) == text, "a stored JWS expanded differently")
    }

    /// Apple's real roots, as production verifies.
    private static let roots: ChainVerifier? = (try? TrustStore.apple()).map { ChainVerifier(roots: $0.roots) }

    /// JSON as the server reads bodies and verifyReceipt answers.
    static func json(_ bytes: [UInt8]) {
        guard let value = try? JSONValue.parse(bytes) else { return }
        _ = JWSTransaction(json: value)
        _ = value["status"]?.int64
    }

    /// `.storekit` files and Storekeeper catalogs.
    static func catalog(_ bytes: [UInt8]) {
        _ = try? StoreKitConfiguration(data: Data(bytes))
        _ = try? JSONDecoder().decode(CatalogFile.self, from: Data(bytes))
    }

    /// What Apple (or anything pretending to be it) answers the HTTP client, fed in two pieces.
    static func httpResponse(_ bytes: [UInt8]) {
        var parser = ResponseParser(maxBodyBytes: 1 << 20)
        let split = bytes.isEmpty ? 0 : Int(bytes[0]) % (bytes.count + 1)
        bytes.withUnsafeBytes { buffer in
            guard (try? parser.feed(UnsafeRawBufferPointer(rebasing: buffer[..<split]))) == false else { return }
            if (try? parser.feed(UnsafeRawBufferPointer(rebasing: buffer[split...]))) == false { _ = parser.finishAtEndOfStream() }
        }
    }

    /// A request as the server builds it from what libmicrohttpd hands over: target, headers, body.
    /// Bytes are `METHOD target\nName: value\n…\n\nbody`; the responder is the purchase server's.
    static func httpRequest(_ bytes: [UInt8]) {
        guard let request = RequestInput.request(bytes) else { return }
        RequestInput.respond(request)
    }
}
