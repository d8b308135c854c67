import AppStoreCrypto
import AppStoreModels
import Foundation

/// `storekeeper receipt decode [FILE|-] [--verify-with ROOT.pem]`
struct ReceiptDecodeCommand: Command {
    static let abstract = "Print any App Store receipt as JSON in verifyReceipt's `receipt` shape."
    static let help = """
    [FILE|-] [--verify-with PEM]...

    ARGUMENTS:
      FILE                 A receipt file: Base64 text or raw DER (default: standard input).
    OPTIONS:
      --verify-with PEM    Check the signature chain against the certificates in PEM (repeatable),
                           at the receipt's creation date (iOS 6 receipts: at the purchase date).
                           Every certificate in PEM is a trust anchor.
    Exit status 0 when decoded (and verified), 2 when the signature check fails.
    """

    let path: String
    let trustFiles: [String]

    init(_ arguments: inout Arguments) throws {
        trustFiles = try arguments.options("verify-with")
        let rest = try arguments.positionals()
        guard rest.count <= 1 else { throw UsageError(description: "give one receipt file") }
        path = rest.first ?? "-"
    }

    func run() async throws {
        let input = try readInput(path)
        let bytes: [UInt8]
        if let first = input.first, first == 0x30 {
            bytes = Array(input)
        } else if let decoded = ReceiptDecoder.base64Decode(String(decoding: input, as: UTF8.self)) {
            bytes = decoded
        } else {
            throw CommandFailure(description: "the input is neither DER nor Base64")
        }
        let decoded = try ReceiptDecoder.decode(bytes)
        var output: [String: Any]
        switch decoded {
        case .app(let receipt, _):
            let data = try Response.encoder.encode(ReceiptInfo(receipt, requestDate: nil))
            output = try JSONSerialization.jsonObject(with: data) as? [String: Any] ?? [:]
        case .transaction(let legacy):
            output = legacy.receiptJSON
        }
        var verification: [String: Any]?
        if !trustFiles.isEmpty {
            var roots: [Certificate] = []
            for file in trustFiles {
                roots += try Certificate.parsePEM(String(decoding: try readInput(file), as: UTF8.self))
            }
            let verifier = ChainVerifier(roots: roots, allowPartialChain: true)
            do {
                switch decoded {
                case .app(let receipt, let signedData):
                    let date = receipt.creationDate ?? Date()
                    let signer = try signedData.verify(with: verifier, at: date,
                                                       policy: receipt.receiptType == .xcode ? .none : .appleReceiptSigning)
                    verification = ["valid": true, "validatedAt": ReceiptDate.rfc3339(date),
                                    "signer": (try? signer.fields.subjectCommonName) as Any? ?? NSNull(),
                                    "digest": signedData.digest == .sha1 ? "sha1" : "sha256"]
                case .transaction(let legacy):
                    // An iOS 6 receipt embeds only its leaf: self-issued certificates of the file are the anchors,
                    // the others the intermediates, so the chain (and Apple's markers on it) is built whole.
                    let selfIssued = roots.filter { (try? $0.fields).map { $0.subject == $0.issuer } ?? false }
                    let anchors = selfIssued.isEmpty ? roots : selfIssued
                    try legacy.verify(with: ChainVerifier(roots: anchors, allowPartialChain: true),
                                      intermediates: roots.filter { certificate in !anchors.contains { $0.der == certificate.der } })
                    verification = ["valid": true, "validatedAt": ReceiptDate.rfc3339(legacy.purchaseDate ?? Date())]
                }
            } catch {
                verification = ["valid": false, "error": "\(error)"]
            }
        }
        if let verification {
            try printJSON(["receipt": output, "verification": verification])
            if verification["valid"] as? Bool != true { exit(2) }
        } else {
            try printJSON(output)
        }
    }
}

/// The shared JSON encoder for CLI output.
enum Response {
    static let encoder: JSONEncoder = {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return encoder
    }()
}
