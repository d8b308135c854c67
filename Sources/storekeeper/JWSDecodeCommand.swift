import AppStoreCrypto
import AppStoreModels
import Foundation
import Locking
import PurchaseServer
import Synchronization

/// `storekeeper jws decode [FILE|-] [--verify-with ROOT.pem]`
struct JWSDecodeCommand: Command {
    static let abstract = "Print a JWS (signed transaction, renewal info, notification) as header and payload JSON."
    static let help = """
    [FILE|-] [--verify-with PEM]...

    ARGUMENTS:
      FILE                 A compact JWS, or a JSON object holding one in "signedPayload" (a notification
                           body); default standard input.
    OPTIONS:
      --verify-with PEM    Check alg ES256, the x5c chain to the certificates in PEM (trust anchors) with
                           Apple's marker OIDs, and the signature, at the payload's signedDate.
    Nested JWS (signedTransactionInfo, signedRenewalInfo, signedAppTransactionInfo) are decoded in place,
    and verified the same way. Exit status 0 when decoded (and verified), 2 when a check fails.
    """

    let path: String
    let trustFiles: [String]

    init(_ arguments: inout Arguments) throws {
        trustFiles = try arguments.options("verify-with")
        let rest = try arguments.positionals()
        guard rest.count <= 1 else { throw UsageError(description: "give one JWS file") }
        path = rest.first ?? "-"
    }

    func run() async throws {
        var text = String(decoding: try readInput(path), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if text.hasPrefix("{"), let body = try? JSONValue.parse(Array(text.utf8)), let signed = body["signedPayload"]?.text {
            text = signed
        }
        var verifier: ChainVerifier?
        if !trustFiles.isEmpty {
            var roots: [Certificate] = []
            for file in trustFiles { roots += try Certificate.parsePEM(String(decoding: try readInput(file), as: UTF8.self)) }
            verifier = ChainVerifier(roots: roots)
        }
        var failed = false
        let output = try decode(text, verifier: verifier, failed: &failed)
        try printJSON(output)
        if failed { exit(2) }
    }

    /// Header, payload (nested JWS decoded) and, with a verifier, the verification outcome.
    func decode(_ compact: String, verifier: ChainVerifier?, failed: inout Bool) throws -> [String: Any] {
        let jws = try JWS(compact: compact)
        var payload = try JSONSerialization.jsonObject(with: Data(jws.payload)) as? [String: Any] ?? [:]
        for key in ["signedTransactionInfo", "signedRenewalInfo", "signedAppTransactionInfo"] {
            for container in ["data", "appData"] {
                if var inner = payload[container] as? [String: Any], let nested = inner[key] as? String {
                    inner[key] = try decode(nested, verifier: verifier, failed: &failed)
                    payload[container] = inner
                }
            }
        }
        var output: [String: Any] = [
            "header": try JSONSerialization.jsonObject(with: Data(jws.headerBytes)),
            "payload": payload,
        ]
        if let verifier {
            let json = try jws.payloadJSON()
            let signedDate = (json["signedDate"] ?? json["receiptCreationDate"])?.int64.map(ReceiptDate.date(milliseconds:)) ?? Date()
            do {
                let leaf = try jws.verify(with: verifier, at: signedDate)
                output["verification"] = ["valid": true, "validatedAt": ReceiptDate.rfc3339(signedDate),
                                          "signer": (try? leaf.fields.subjectCommonName) as Any? ?? NSNull()]
            } catch {
                failed = true
                output["verification"] = ["valid": false, "error": "\(error)"]
            }
        }
        return output
    }
}

/// `storekeeper jws bench FILE --verify-with ROOT.pem [--seconds S]`
struct JWSBenchCommand: Command {
    static let abstract = "Measure signed transactions verified per second by the purchase server's verifier, on every core."
    static let help = """
    FILE --verify-with PEM [--seconds S]

    Verifies the signed transaction in FILE over and over, as POST /v1/transactions does (parse, chain cached after
    the first time, ES256 signature, bundle id, environment), on one thread per core, and prints the rate.
    """
    let path: String
    let trustFile: String
    let seconds: Double

    init(_ arguments: inout Arguments) throws {
        guard let trust = try arguments.option("verify-with") else { throw UsageError(description: "--verify-with is required") }
        trustFile = trust
        seconds = Double(try arguments.option("seconds") ?? "5") ?? 5
        path = try arguments.single("FILE")
    }

    func run() async throws {
        let compact = String(decoding: try readInput(path), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        let roots = try Certificate.parsePEM(String(decoding: try readInput(trustFile), as: UTF8.self))
        // Nothing remembered between checks: every one verifies the signature, as Apple's verifier does.
        let inspector = SignedTransactionInspector(trust: TrustStore(certificates: roots), remembersVerified: false)
        guard let bundle = try JWS(compact: compact).payloadJSON()["bundleId"]?.text else { throw CommandFailure(description: "not a signed transaction") }
        _ = try inspector.inspect(compact, bundleIds: [bundle])  // fails loudly here if the JWS does not verify
        let threads = ProcessInfo.processInfo.activeProcessorCount
        let counts = Locked([Int](repeating: 0, count: threads))
        let deadline = Date().addingTimeInterval(seconds)
        let started = Date()
        DispatchQueue.concurrentPerform(iterations: threads) { thread in
            var done = 0
            while done % 256 != 0 || Date() < deadline {
                if (try? inspector.inspect(compact, bundleIds: [bundle])) != nil { done += 1 }
            }
            counts.withLock { $0[thread] = done }
        }
        let total = counts.withLock { $0.reduce(0, +) }
        let elapsed = Date().timeIntervalSince(started)
        try printJSON(["verified": total, "seconds": (elapsed * 100).rounded() / 100, "perSecond": Int(Double(total) / elapsed), "threads": threads])
    }
}
