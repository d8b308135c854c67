import AppStoreCrypto
import Foundation
import Locking

/// Records what Apple answers the server (verifyReceipt and the App Store Server API) as JSON lines, so a
/// team captures its real sandbox traffic once and serves it back in CI (`storekeeper appstore replay`).
///
/// Never recorded: the shared secret (`password`), the Server API's bearer token, any request header. With
/// `redactReceipts` (the default) the receipts sent (`receipt-data`) and the `latest_receipt` Apple returns
/// are replaced by `"<redacted>"`; each request keeps the SHA-256 of its original body, which is what replay
/// matches on. Signed transactions in answers are kept: a backend under replay verifies them.
public final class AppleTrafficRecorder: Sendable {
    /// One request and its answer, as a line of the file.
    public struct Exchange: Codable, Sendable, Equatable {
        public var at: String
        public var method: String
        /// The URL called (Apple's, or an emulator's).
        public var url: String
        /// `production` or `sandbox`, and the API path without an environment (`/verifyReceipt`, `/inApps/v1/...`).
        public var environment: String
        public var path: String
        /// The request body as sent, redacted (nil when empty).
        public var requestBody: String?
        /// Lowercase hex SHA-256 of the request body before redaction.
        public var requestSHA256: String
        public var status: Int
        public var contentType: String?
        public var body: String
    }

    private let handle: FileHandle
    private let lock = Locked(())
    public let redactReceipts: Bool

    /// Opens (appending to) `path`, 0600 whether new or not: even redacted, the traffic is customer data. A symbolic
    /// link or anything but a regular file is refused.
    public init(path: String, redactReceipts: Bool = true) throws {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw ServerError(.invalidUrl, "cannot open the recording \(path): \(String(cString: strerror(errno)))") }
        var info = stat()
        guard fstat(fd, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, fchmod(fd, 0o600) == 0 else {
            close(fd)
            throw ServerError(.invalidUrl, "the recording \(path) must be a regular file of this user")
        }
        handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
        self.redactReceipts = redactReceipts
    }

    /// Appends one exchange (best effort: a full disk must not fail a verification).
    public func record(method: String, url: URL, requestBody: Data, status: Int, contentType: String?, body: Data, at: Date) {
        guard let (environment, path) = Self.route(url) else { return }
        let exchange = Exchange(at: ISO8601DateFormatter().string(from: at), method: method, url: url.absoluteString, environment: environment,
                                path: path, requestBody: requestBody.isEmpty ? nil : String(decoding: redact(requestBody, keys: ["password", "receipt-data"]), as: UTF8.self),
                                requestSHA256: Self.hex(Digest.sha256.hash(requestBody)), status: status, contentType: contentType,
                                body: String(decoding: redact(body, keys: ["latest_receipt"]), as: UTF8.self))
        guard var line = try? JSONEncoder().encode(exchange) else { return }
        line.append(0x0a)
        lock.withLock { _ in try? handle.write(contentsOf: line) }
    }

    /// Replaces the values of `keys` in a top-level JSON object; `password` always, receipts when configured.
    private func redact(_ data: Data, keys: Set<String>) -> Data {
        guard var object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return data }
        var changed = false
        for key in keys where object[key] != nil && (key == "password" || redactReceipts) {
            object[key] = "<redacted>"
            changed = true
        }
        guard changed, let redacted = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else { return data }
        return redacted
    }

    /// The environment and API path a URL means: Apple's hosts, or an emulator's `/production` and `/sandbox` prefixes.
    public static func route(_ url: URL) -> (environment: String, path: String)? {
        let host = url.host?.lowercased() ?? ""
        var path = url.path.isEmpty ? "/" : url.path
        if let query = url.query { path += "?" + query }
        switch host {
        case "buy.itunes.apple.com", "api.storekit.itunes.apple.com", "api.storekit.apple.com": return ("production", path)
        case "sandbox.itunes.apple.com", "api.storekit-sandbox.itunes.apple.com", "api.storekit-sandbox.apple.com": return ("sandbox", path)
        default:
            for environment in ["production", "sandbox"] where path.hasPrefix("/\(environment)/") {
                return (environment, String(path.dropFirst(environment.count + 1)))
            }
            return nil
        }
    }

    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
}

/// verifyReceipt calls through another transport, recorded.
public struct RecordingTransport: HTTPTransport {
    let inner: any HTTPTransport
    let recorder: AppleTrafficRecorder

    public init(_ inner: any HTTPTransport, recorder: AppleTrafficRecorder) {
        self.inner = inner
        self.recorder = recorder
    }

    public var keepsTimeouts: Bool { inner.keepsTimeouts }

    public func post(_ url: URL, body: [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data) {
        let answer = try await inner.post(url, body: body, timeout: timeout)
        recorder.record(method: "POST", url: url, requestBody: Data(body), status: answer.status, contentType: answer.contentType, body: answer.body, at: Date())
        return answer
    }
}
