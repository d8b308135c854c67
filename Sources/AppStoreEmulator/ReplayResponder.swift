import AppStoreCrypto
import Foundation
import HTTP
import Locking

/// Serves back what a purchase server recorded from Apple (`storekeeper server serve --record FILE`):
/// verifyReceipt and the App Store Server API, by environment and path, under Apple's host names (through
/// the proxy or a hosts entry) or the emulator's `/production` and `/sandbox` prefixes.
///
/// A request gets the recorded answers to the same request body when there are some (the SHA-256 kept even
/// when the body was redacted), else the answers to the same method and path; either way in the order they
/// were recorded, the last one repeating. Anything never recorded is 404 `not_recorded`.
public final class ReplayResponder: Responder, Sendable {
    struct Entry: Decodable, Sendable {
        var method: String
        var environment: String
        var path: String
        var requestSHA256: String
        var status: Int
        var contentType: String?
        var body: String
    }

    struct Key: Hashable, Sendable {
        var method: String
        var environment: String
        var path: String
    }

    private let entries: [Key: [Entry]]
    private let next = Locked<[Key: Int]>([:])
    /// How many answers were read.
    public let count: Int

    /// A failure to read a recording, with the line at fault.
    public struct ReadError: Error, CustomStringConvertible {
        public let description: String
    }

    /// Reads a recording (one JSON object per line; blank lines skipped).
    public init(recording: Data) throws(ReadError) {
        var entries: [Key: [Entry]] = [:]
        var count = 0
        for (number, line) in recording.split(separator: 0x0a).enumerated() where !line.allSatisfy({ $0 == 0x20 || $0 == 0x0d }) {
            guard let entry = try? JSONDecoder().decode(Entry.self, from: Data(line)) else {
                throw ReadError(description: "line \(number + 1) is not a recorded exchange")
            }
            guard ["production", "sandbox"].contains(entry.environment), (100...599).contains(entry.status) else {
                throw ReadError(description: "line \(number + 1): environment is production or sandbox, status 100–599")
            }
            entries[Key(method: entry.method.uppercased(), environment: entry.environment, path: entry.path), default: []].append(entry)
            count += 1
        }
        self.entries = entries
        self.count = count
    }

    public func respond(to request: Request) async -> Response {
        guard let (environment, path) = Self.route(request) else {
            return HTTPError(.notFound, code: "not_recorded", message: "Replay serves verifyReceipt and the Server API of production and sandbox only.").response
        }
        let key = Key(method: request.method.rawValue, environment: environment, path: path)
        guard let candidates = entries[key], !candidates.isEmpty else {
            return HTTPError(.notFound, code: "not_recorded", message: "Nothing was recorded for \(request.method.rawValue) \(path) in \(environment).").response
        }
        // Answers to this very body (a receipt verified again) come in their recorded order; a body never
        // recorded, or none at all (a GET), takes the path's answers in order.
        let digest = request.body.isEmpty ? "" : Digest.sha256.hash(request.body).map { String(format: "%02x", $0) }.joined()
        let sameBody = digest.isEmpty ? [] : candidates.filter { $0.requestSHA256 == digest }
        let pool = sameBody.isEmpty ? candidates : sameBody
        let counter = Key(method: key.method, environment: key.environment, path: key.path + (sameBody.isEmpty ? "" : "#" + digest))
        let entry = next.withLock { next in
            let index = next[counter] ?? 0
            next[counter] = index + 1
            return pool[min(index, pool.count - 1)]
        }
        return Response(status: HTTPStatus(entry.status), headers: ["Content-Type": entry.contentType ?? "application/json"], body: Data(entry.body.utf8))
    }

    /// The environment and API path of a request: by Apple's host name, else by the emulator's prefix.
    static func route(_ request: Request) -> (String, String)? {
        var path = request.path
        let query = request.queryItems.map { item in
            "\(item.name.addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed) ?? item.name)=\(item.value.addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed) ?? item.value)"
        }.joined(separator: "&")
        if !query.isEmpty { path += "?" + query }
        if let host = request.host {
            if let environment = AppleHosts.verifyReceipt[host] ?? AppleHosts.serverAPI[host] { return (environment.pathComponent, path) }
        }
        for environment in ["production", "sandbox"] where path.hasPrefix("/\(environment)/") {
            return (environment, String(path.dropFirst(environment.count + 1)))
        }
        return nil
    }
}
