import AppStoreModels
import Foundation
import HTTPClient
import Locking
import Synchronization

/// Where verifyReceipt lives: Apple's hosts by default, the emulator's URLs in tests.
public struct AppStoreEndpoints: Sendable, Equatable {
    public var production: URL
    public var sandbox: URL

    public init(production: URL, sandbox: URL) {
        self.production = production
        self.sandbox = sandbox
    }

    /// `https://buy.itunes.apple.com/verifyReceipt` and `https://sandbox.itunes.apple.com/verifyReceipt`.
    public static let apple = AppStoreEndpoints(production: URL(string: "https://buy.itunes.apple.com/verifyReceipt")!,
                                                sandbox: URL(string: "https://sandbox.itunes.apple.com/verifyReceipt")!)

    /// A Storekeeper App Store emulator at `base` (`/production/verifyReceipt`, `/sandbox/verifyReceipt`).
    public static func emulator(_ base: URL) -> AppStoreEndpoints {
        AppStoreEndpoints(production: base.appendingPathComponent("production/verifyReceipt"),
                          sandbox: base.appendingPathComponent("sandbox/verifyReceipt"))
    }

    public func url(for environment: AppStoreEnvironment) -> URL { environment == .production ? production : sandbox }
}

/// Sends one HTTP POST; the server injects a fake in unit tests.
public protocol HTTPTransport: Sendable {
    /// Returns the status code, content type and body, or throws on a network failure or timeout.
    func post(_ url: URL, body: consuming [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data)
    /// Whether `post` ends by `timeout` itself. Calls through one that does not are raced against a timer.
    var keepsTimeouts: Bool { get }
}

extension HTTPTransport {
    public var keepsTimeouts: Bool { false }
}

/// `HTTPTransport` over Storekeeper's HTTP client: one event-loop thread, kept-alive connections,
/// thousands of calls in flight for the cost of a socket each.
public final class ClientTransport: HTTPTransport {
    private let client: HTTPClient

    /// Creates a transport allowing `connectionsPerHost` parallel connections; `caFile` adds trusted roots for HTTPS.
    /// `openAtMost`, when given, bounds the connections it keeps open in all now (`HTTPClient.Configuration.openAtMost`).
    public init(connectionsPerHost: Int = 8192, caFile: String? = nil, openAtMost: (@Sendable () -> Int)? = nil) throws {
        var configuration = HTTPClient.Configuration(maxConnectionsPerHost: connectionsPerHost, caFile: caFile)
        // Thousands of calls held for Apple's latency share a few connections where the host speaks HTTP/2.
        configuration.http2PriorKnowledge = true
        configuration.openAtMost = openAtMost
        client = try HTTPClient(configuration: configuration)
    }

    /// Calls on HTTP/2 streams now: they hold no connection of their own.
    public var multiplexedCalls: Int { client.requestsOnHTTP2 }

    /// The client's event loop ends every request at its deadline: no timer per call is needed (with thousands of
    /// calls in flight, a timer each was a task and a Dispatch timer each, for as long as the timeout).
    public var keepsTimeouts: Bool { true }

    public func post(_ url: URL, body: consuming [UInt8], timeout: TimeInterval) async throws -> (status: Int, contentType: String?, body: Data) {
        let response = try await client.send("POST", url, headers: [("Content-Type", "application/json; charset=utf-8")],
                                              body: consume body, timeout: timeout)
        return (response.status, response.header("Content-Type"), Data(response.body))
    }
}

/// What one call to verifyReceipt came to.
public enum AppleAnswer: Sendable {
    /// Apple answered with a JSON status that is final (0, 21002, 21003, 21004, 21006, 21007, 21008, 21010, 211xx not retryable),
    /// with the raw body (iOS 6 style answers have their own shape).
    /// Boxed (`indirect`): the answer is 400 bytes, and every async frame that holds one while a call waits on
    /// Apple reserves room for it; boxed, a frame holds a pointer.
    indirect case answered(VerifyReceiptResponse, Data)
    /// A temporary failure worth retrying: timeout, connection error, HTTP 5xx, HTML with 200, 21005, 21009, retryable 211xx.
    case retryable(Retry)

    /// Why a call is worth retrying, as a value: whether it timed out is a field, never read from the text.
    public struct Retry: Sendable, Equatable {
        public enum Kind: String, Sendable {
            /// No answer within the call's timeout (the job shows `timed_out`).
            case timedOut = "timed_out"
            /// The connection failed or broke.
            case connection
            /// Apple answered, but not with a final status (HTTP 5xx, HTML, 21005, 21009, retryable 211xx).
            case unavailable
        }
        public var kind: Kind
        public var reason: String

        public static func timedOut() -> Retry { Retry(kind: .timedOut, reason: "verification timed out") }
    }
}

/// Calls verifyReceipt and sorts the outcome into final answers and retryable failures.
public struct VerifyReceiptClient: Sendable {
    public let endpoints: AppStoreEndpoints
    public let transport: any HTTPTransport
    /// Per-call timeout in seconds.
    public let timeout: TimeInterval

    public init(endpoints: AppStoreEndpoints, transport: any HTTPTransport, timeout: TimeInterval = 15) {
        self.endpoints = endpoints
        self.transport = transport
        self.timeout = timeout
    }

    /// The verifyReceipt request, written directly (JSONSerialization escapes a multi-kilobyte receipt character by
    /// character) and kept as the buffer's own bytes: with thousands of calls waiting on Apple, each copy counts.
    static func requestBody(_ receiptData: String, password: String?) -> [UInt8] {
        var json = JSONBuffer(capacity: receiptData.utf8.count + 128)
        json.object { json in
            json.field("receipt-data", receiptData)
            json.field("password", password)
            json.field("exclude-old-transactions", false)
        }
        return json.bytes
    }

    /// One call to one environment.
    ///
    /// Thousands of these wait on Apple at once, each in an async frame that lives as long as the call: the frame
    /// holds only the reply, and reading it (`answer(_:environment:)`) and naming a failure (`failure(_:)`) are
    /// plain functions whose locals live on the thread's stack (the frame was 4.3 KB when they were inline).
    public func verify(_ receiptData: consuming String, password: String?, environment: AppStoreEnvironment) async -> AppleAnswer {
        do {
            return Self.answer(try await post(consume receiptData, password: password, environment: environment), environment: environment)
        } catch {
            return Self.failure(error)
        }
    }

    /// The call itself.
    private func post(_ receiptData: consuming String, password: String?, environment: AppStoreEnvironment) async throws
        -> (status: Int, contentType: String?, body: Data) {
        let body = Self.requestBody(receiptData, password: password)
        // The text is let go here and the body handed over (consumed): while the call waits on Apple, the request's
        // bytes are the receipt's only copy.
        _ = consume receiptData
        if transport.keepsTimeouts {
            return try await transport.post(endpoints.url(for: environment), body: consume body, timeout: timeout)
        }
        return try await Self.deadline(timeout + 1) { [transport, endpoints, timeout] in
            try await transport.post(endpoints.url(for: environment), body: body, timeout: timeout)
        }
    }

    /// A call that failed before Apple answered: always worth retrying.
    @inline(never)
    static func failure(_ error: any Error) -> AppleAnswer {
        if let error = error as? URLError, error.code == .timedOut { return .retryable(.timedOut()) }
        if let error = error as? HTTPClientError, error.code == .timedOut { return .retryable(.timedOut()) }
        return .retryable(.init(kind: .connection, reason: "connection error: \(describe(error))"))
    }

    /// Apple's reply sorted into a final answer or a retryable failure.
    @inline(never)
    static func answer(_ reply: (status: Int, contentType: String?, body: Data), environment: AppStoreEnvironment) -> AppleAnswer {
        guard reply.status == 200 else {
            return .retryable(.init(kind: .unavailable, reason: "HTTP \(reply.status) from \(environment.rawValue.lowercased()) verifyReceipt"))
        }
        guard let response = try? VerifyReceiptResponse(jsonBytes: reply.body) else {
            let kind = (reply.contentType ?? "").contains("html") ? "an HTML page" : "a non-JSON body"
            return .retryable(.init(kind: .unavailable, reason: "\(environment.rawValue.lowercased()) verifyReceipt answered \(kind) with HTTP 200"))
        }
        switch response.status {
        case VerifyReceiptStatus.serverUnavailable, VerifyReceiptStatus.internalDataAccessError:
            return .retryable(.init(kind: .unavailable, reason: "App Store status \(response.status)"))
        case 21100...21199 where response.isRetryable != false:
            return .retryable(.init(kind: .unavailable, reason: "App Store status \(response.status) (retryable)"))
        default:
            return .answered(response, reply.body)
        }
    }

    /// Runs `operation` but gives up after `seconds` even if the operation ignores cancellation
    /// (a stuck socket must never hold a verification past its lease).
    static func deadline<T: Sendable>(_ seconds: TimeInterval, _ operation: @escaping @Sendable () async throws -> T) async throws -> T {
        let gate = FirstResult<T>()
        let work = Task { gate.finish(with: await Result { try await operation() }) }
        let timer = Task {
            try? await Task.sleep(for: .milliseconds(Int(seconds.isFinite ? min(max(0, seconds), 86_400) * 1000 : 86_400_000)))
            gate.finish(with: .failure(URLError(.timedOut)))
        }
        let result = await gate.value
        work.cancel()
        timer.cancel()
        return try result.get()
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? URLError { return "URLError \(error.code.rawValue)" }
        if let error = error as? HTTPClientError { return error.description }
        return String(describing: type(of: error))
    }
}

/// The first of several results; later ones are ignored.
final class FirstResult<T: Sendable>: Sendable {
    private let state = Locked<(result: Result<T, any Error>?, waiter: CheckedContinuation<Result<T, any Error>, Never>?)>((nil, nil))

    func finish(with result: Result<T, any Error>) {
        let waiter = state.withLock { state -> CheckedContinuation<Result<T, any Error>, Never>? in
            guard state.result == nil else { return nil }
            state.result = result
            let waiter = state.waiter
            state.waiter = nil
            return waiter
        }
        waiter?.resume(returning: result)
    }

    var value: Result<T, any Error> {
        get async {
            await withCheckedContinuation { continuation in
                let ready = state.withLock { state -> Result<T, any Error>? in
                    if let result = state.result { return result }
                    state.waiter = continuation
                    return nil
                }
                if let ready { continuation.resume(returning: ready) }
            }
        }
    }
}

extension Result where Failure == any Error {
    init(catching body: () async throws -> Success) async {
        do { self = .success(try await body()) } catch { self = .failure(error) }
    }
}
