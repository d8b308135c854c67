import AppStoreEmulator
import Foundation
import HTTP
@testable import PurchaseServer
import Testing

/// `server serve --record` writes what Apple answered; `appstore replay` serves it back.
@Suite("Recording Apple's answers and replaying them")
struct RecordReplayTests {
    @Test("Secrets and receipts are redacted, each request keeps its digest, and replay matches by body, then by order")
    func roundTrip() async throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("record-\(UUID().uuidString).jsonl").path
        defer { try? FileManager.default.removeItem(atPath: path) }
        let recorder = try AppleTrafficRecorder(path: path)
        let request = Data(#"{"receipt-data":"MIIsecretreceipt","password":"shared-secret-123","exclude-old-transactions":true}"#.utf8)
        let answer = Data(#"{"status":0,"latest_receipt":"MIIlatest","environment":"Production"}"#.utf8)
        recorder.record(method: "POST", url: URL(string: "https://buy.itunes.apple.com/verifyReceipt")!, requestBody: request, status: 200,
                        contentType: "application/json", body: answer, at: Date())
        recorder.record(method: "GET", url: URL(string: "https://api.storekit-sandbox.apple.com/inApps/v1/transactions/2000000000000001")!,
                        requestBody: Data(), status: 200, contentType: "application/json", body: Data(#"{"signedTransactionInfo":"eyJ.a.b"}"#.utf8), at: Date())
        recorder.record(method: "GET", url: URL(string: "http://127.0.0.1:8010/sandbox/inApps/v1/transactions/2000000000000001")!,
                        requestBody: Data(), status: 404, contentType: "application/json", body: Data(#"{"errorCode":4040010}"#.utf8), at: Date())
        recorder.record(method: "GET", url: URL(string: "https://example.com/other")!, requestBody: Data(), status: 200, contentType: nil, body: Data(), at: Date())
        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(!text.contains("shared-secret-123") && !text.contains("MIIsecretreceipt") && !text.contains("MIIlatest"))
        #expect(text.split(separator: "\n").count == 3, "only Apple's APIs are recorded")
        #expect(try FileManager.default.attributesOfItem(atPath: path)[.posixPermissions] as? Int == 0o600)

        let replay = try ReplayResponder(recording: Data(text.utf8))
        #expect(replay.count == 3)
        // The same body, at the emulator's path or Apple's host: the recorded answer, though the file keeps no receipt.
        for target in [("/production/verifyReceipt", [String: String]()), ("/verifyReceipt", ["Host": "buy.itunes.apple.com"])] {
            let response = await replay.respond(to: Request(method: .post, target: target.0, headers: target.1, body: request))
            #expect(response.status.code == 200 && String(decoding: response.body, as: UTF8.self).contains("\"status\":0"))
        }
        #expect(await replay.respond(to: Request(method: .post, target: "/sandbox/verifyReceipt", body: request)).status.code == 404,
                "another environment was never recorded")
        // By order for the same path: the first answer, then the second, which then repeats.
        let lookup = { await replay.respond(to: Request(method: .get, target: "/inApps/v1/transactions/2000000000000001",
                                                        headers: ["Host": "api.storekit-sandbox.apple.com"])).status.code }
        #expect(await lookup() == 200)
        #expect(await lookup() == 404)
        #expect(await lookup() == 404)
        #expect(throws: ReplayResponder.ReadError.self) { try ReplayResponder(recording: Data("{\"method\":1}\n".utf8)) }
    }

    @Test("The recording is 0600 even when it existed with other permissions; a symbolic link is refused")
    func fileSafety() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("record-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let existing = directory.appendingPathComponent("open.jsonl").path
        #expect(FileManager.default.createFile(atPath: existing, contents: Data(), attributes: [.posixPermissions: 0o644]))
        _ = try AppleTrafficRecorder(path: existing)
        #expect(try FileManager.default.attributesOfItem(atPath: existing)[.posixPermissions] as? Int == 0o600)
        let link = directory.appendingPathComponent("link.jsonl").path
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: existing)
        #expect(throws: ServerError.self) { _ = try AppleTrafficRecorder(path: link) }
        #expect(throws: ServerError.self) { _ = try AppleTrafficRecorder(path: directory.path) }
    }
}
