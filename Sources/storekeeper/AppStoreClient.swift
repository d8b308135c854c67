import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// A small JSON client for the emulator's admin API, used by the CLI.
struct AdminClient {
    let base: URL
    var bearer: String?

    init(url: String, bearer: String? = nil) throws {
        self.bearer = bearer
        guard let base = URL(string: url), base.scheme == "http" || base.scheme == "https" else {
            throw UsageError(description: "--url must be an http(s) URL")
        }
        self.base = base
    }

    /// Sends a request; returns the body bytes of a 2xx answer or throws the server's error message.
    func send(_ method: String, _ path: String, json: Any? = nil) async throws -> Data {
        guard let url = URL(string: path, relativeTo: base) else { throw CommandFailure(description: "bad path \(path)") }
        var request = URLRequest(url: url)
        request.httpMethod = method
        request.timeoutInterval = 60
        if let bearer { request.setValue("Bearer \(bearer)", forHTTPHeaderField: "Authorization") }
        if let json {
            request.httpBody = try JSONSerialization.data(withJSONObject: json)
            request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        let (data, response): (Data, URLResponse)
        do {
            (data, response) = try await URLSession.shared.data(for: request)
        } catch {
            throw CommandFailure(description: "cannot reach \(base.absoluteString): \(error.localizedDescription)")
        }
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        guard (200..<300).contains(status) else {
            if let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
               let detail = object["error"] as? [String: Any] {
                throw CommandFailure(description: "\(detail["message"] as? String ?? "request failed") (\(detail["code"] as? String ?? "\(status)"))")
            }
            throw CommandFailure(description: "HTTP \(status) from \(path)")
        }
        return data
    }

    /// Sends and prints the JSON answer.
    func sendAndPrint(_ method: String, _ path: String, json: Any? = nil) async throws {
        let data = try await send(method, path, json: json)
        if data.isEmpty { return }
        if let object = try? JSONSerialization.jsonObject(with: data) {
            try printJSON(object)
        } else {
            print(String(decoding: data, as: UTF8.self), terminator: "")
        }
    }
}

/// The `--url` option shared by commands that act on a running emulator.
/// The emulator's admin token for the CLI, if it was started with one.
func emulatorToken() -> String? { ProcessInfo.processInfo.environment["STOREKEEPER_APPSTORE_TOKEN"] }

func emulatorURL(_ arguments: inout Arguments) throws -> String {
    try arguments.option("url") ?? ProcessInfo.processInfo.environment["STOREKEEPER_APPSTORE_URL"] ?? "http://127.0.0.1:8010"
}
