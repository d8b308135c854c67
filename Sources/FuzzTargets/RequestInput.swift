import Foundation
import HTTP
import Locking
import PurchaseServer
import SQLiteStorage
import Synchronization

/// The purchase server's request handling as a fuzz target: one server (SQLite in a temporary
/// file, one app with a public and a secret key, no worker), and a byte format for requests.
enum RequestInput {
    /// Parses `METHOD target\nName: value\n…\n\nbody`; placeholders `$SK`/`$PK`/`$ADMIN` become real keys.
    static func request(_ bytes: [UInt8]) -> Request? {
        guard let world = world else { return nil }
        let separator: [UInt8] = [10, 10]
        var headEnd = bytes.endIndex
        var bodyStart = bytes.endIndex
        if bytes.count >= 2 {
            for index in 0..<(bytes.count - 1) where bytes[index] == separator[0] && bytes[index + 1] == separator[1] {
                headEnd = index
                bodyStart = index + 2
                break
            }
        }
        let head = String(decoding: bytes[..<headEnd], as: UTF8.self)
        var lines = head.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        guard !lines.isEmpty else { return nil }
        let requestLine = lines.removeFirst().split(separator: " ", maxSplits: 1).map(String.init)
        guard requestLine.count == 2 else { return nil }
        var headers: [String: String] = [:]
        for line in lines.prefix(64) {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[String(line[..<colon])] = world.substitute(String(line[line.index(after: colon)...]).trimmingCharacters(in: .whitespaces))
        }
        return Request(method: HTTPMethod(rawValue: requestLine[0]), target: requestLine[1], headers: headers, body: Data(bytes[bodyStart...]))
    }

    /// Admits and answers `request` as the HTTP server would, waiting for the answer.
    static func respond(_ request: Request) {
        guard let world else { return }
        let responder = world.responder
        let head = RequestHead(method: request.method, path: request.path, headers: request.headers, contentLength: request.body.count)
        if case .refuse = responder.admit(head) { return }
        let done = DispatchSemaphore(value: 0)
        Task {
            _ = await responder.respond(to: request)
            done.signal()
        }
        done.wait()
    }

    struct World: Sendable {
        let responder: PurchaseServerResponder
        let secretKey: String
        let publicKey: String
        static let adminKey = "sk_admin_fuzz"

        func substitute(_ value: String) -> String {
            value.replacingOccurrences(of: "$SK", with: secretKey).replacingOccurrences(of: "$PK", with: publicKey)
                .replacingOccurrences(of: "$ADMIN", with: Self.adminKey)
        }
    }

    /// Never answers: verification is not what this target is about (the receipt targets are).
    struct SilentTransport: HTTPTransport {
        func post(_ url: URL, body: [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data) {
            throw URLError(.timedOut)
        }
    }

    static let world: World? = {
        let box = Locked<World?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            defer { done.signal() }
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("fuzz-\(UUID().uuidString).sqlite").path
            guard let database = try? SQLiteSQLDatabase(path: path), let trust = try? TrustStore.apple() else { return }
            let configuration = PurchaseServer.Configuration(trust: trust, endpoints: .apple, transport: SilentTransport(), adminKey: World.adminKey)
            guard let server = try? await PurchaseServer.open(database: database, configuration: configuration) else { return }
            var app = ServerApp(id: "com.example.coins", sharedSecret: "secret", userAuth: .required, userTokenSecret: "fuzz-user-token-secret-0123456789")
            app.sandboxPolicy = .allow
            try? await server.store.createApp(app, now: Date())
            try? await server.store.setProduct(appId: app.id, ProductMapping(productId: "coins.100", type: .consumable, currency: "coins", amount: 100))
            guard let secret = try? await server.store.createKey(appId: app.id, label: nil, kind: .secret, now: Date()),
                  let publicKey = try? await server.store.createKey(appId: app.id, label: nil, kind: .public, now: Date()) else { return }
            box.withLock { $0 = World(responder: PurchaseServerResponder(server: server), secretKey: secret, publicKey: publicKey) }
        }
        done.wait()
        return box.withLock { $0 }
    }()
}
