import Clocks
import AppStoreEmulator
import AppStoreModels
import Foundation
import HTTP
import Storage

/// Test support: a shared emulator certificate authority, fixed clocks and an in-process HTTP client.
public enum TestSupport {
    /// One CA for every test in a process (RSA key generation is the slow part).
    public static let authority: CertificateAuthority = {
        do { return try CertificateAuthority.generate() } catch { fatalError("cannot generate the test CA: \(error)") }
    }()

    /// The test JWS chain (ECC), generated once per process.
    public static let jwsAuthority: CertificateAuthority = {
        do { return try CertificateAuthority.generate(algorithm: .ecP256) } catch { fatalError("cannot generate the test JWS CA: \(error)") }
    }()

    /// Checks `condition` every `interval` until it holds or `limit` passes, and says whether it held. A test that waits
    /// for something to happen waits here, with one deadline generous enough for a loaded CI machine (what takes
    /// milliseconds on a laptop can take seconds there). A test expects afterwards what it needs of the wait, so a wait
    /// that runs out fails there, not here. A check that something does *not* happen is a plain sleep instead.
    @discardableResult
    public static func eventually(within limit: Duration = .seconds(15), every interval: Duration = .milliseconds(10),
                                  _ condition: () async throws -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + limit
        while true {
            if try await condition() { return true }
            if ContinuousClock.now >= deadline { return false }
            try await Task.sleep(for: interval)
        }
    }

    /// 2026-01-15T10:00:00Z, a fixed "now" for tests.
    public static let referenceDate = Date(timeIntervalSince1970: 1_768_471_200)

    /// A clock frozen at `date` until advanced.
    public static func fixedClock(_ date: Date = referenceDate) -> AdjustableClock {
        AdjustableClock(offset: 0, base: { date })
    }

    /// A clock that starts at `date` and then runs in real time (for retries and leases).
    public static func runningClock(from date: Date = referenceDate) -> AdjustableClock {
        AdjustableClock(offset: date.timeIntervalSinceNow)
    }

    /// An emulator over `store` (in memory by default) with the test CA and a fixed clock.
    public static func emulator(store: any DocumentStore = InMemoryDocumentStore(), clock: AdjustableClock = fixedClock()) async throws -> AppStoreEmulator {
        try await AppStoreEmulator.open(store: store, authority: authority, jwsAuthority: jwsAuthority, xcodeAuthority: xcodeAuthority, clock: clock)
    }

    /// One Xcode-shaped signer for every test emulator (its RSA key takes a moment to make).
    public static let xcodeAuthority: XcodeAuthority = {
        do { return try XcodeAuthority.generate() } catch { fatalError("cannot generate the test Xcode signer: \(error)") }
    }()

    /// The repository root (for `examples/`) and the shared fixtures beside the checkout.
    public static func repositoryRoot(_ file: String = #filePath) -> URL {
        var url = URL(fileURLWithPath: file)
        while url.path != "/" {
            url.deleteLastPathComponent()
            if FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) { return url }
        }
        return URL(fileURLWithPath: FileManager.default.currentDirectoryPath)
    }

    /// `../shared` next to the checkout.
    public static var sharedDirectory: URL { repositoryRoot().deletingLastPathComponent().appendingPathComponent("shared") }

    /// Reads a file under `../shared/fixtures`.
    public static func fixture(_ relative: String) throws -> Data {
        try Data(contentsOf: sharedDirectory.appendingPathComponent("fixtures").appendingPathComponent(relative))
    }

    /// The path of the first fixture whose name starts with `prefix` and ends with `suffix`.
    public static func fixtureNamed(prefix: String, suffix: String, in folder: String = "real") throws -> Data {
        let directory = sharedDirectory.appendingPathComponent("fixtures").appendingPathComponent(folder)
        let names = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        guard let name = names.sorted().first(where: { $0.hasPrefix(prefix) && $0.hasSuffix(suffix) }) else {
            throw CocoaError(.fileNoSuchFile)
        }
        return try Data(contentsOf: directory.appendingPathComponent(name))
    }
}

/// Sends requests straight to a responder, no sockets.
public struct InProcessClient: Sendable {
    let responder: any Responder

    public init(_ responder: any Responder) { self.responder = responder }

    /// Sends a request with an optional JSON body.
    public func send(_ method: HTTPMethod, _ target: String, json: Any? = nil, body: Data? = nil, headers: [String: String] = [:]) async throws -> Response {
        var payload = body ?? Data()
        if let json { payload = try JSONSerialization.data(withJSONObject: json) }
        let request = Request(method: method, target: target, headers: headers, body: payload)
        // As the HTTP server does: the responder's admission first, then its body limit, then its prompt answer.
        switch responder.admit(RequestHead(method: method, path: request.path, headers: headers, contentLength: payload.count)) {
        case .refuse(let response):
            responder.refused(request, with: response)
            return response
        case .accept(let limit) where payload.count > limit:
            let response = HTTPError(.payloadTooLarge, code: "payload_too_large", message: "The request body exceeds \(limit) bytes.").response
            responder.refused(request, with: response)
            return response
        case .accept:
            return await Self.answer(responder.respondPromptly(to: request))
        }
    }

    /// A prompt answer carried out as the HTTP server does (a delay slept here, on the test's task).
    static func answer(_ answer: PromptAnswer) async -> Response {
        switch answer {
        case .now(let response): return response
        case .later(let work): return await work()
        case .after(let delay, let next):
            try? await Task.sleep(for: delay)
            return await Self.answer(next())
        }
    }

    /// Sends and parses the JSON object answered.
    public func json(_ method: HTTPMethod, _ target: String, json: Any? = nil, body: Data? = nil, headers: [String: String] = [:]) async throws -> (Int, [String: Any]) {
        let response = try await send(method, target, json: json, body: body, headers: headers)
        let object = (try? JSONSerialization.jsonObject(with: response.body)) as? [String: Any] ?? [:]
        return (response.status.code, object)
    }
}
