import Clocks
import Foundation

/// What a request came to.
public struct HTTPClientResponse: Sendable {
    public var status: Int
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    /// The first value of header `name` (case-insensitive).
    public func header(_ name: String) -> String? {
        headers.first { $0.name.caseInsensitiveEquals(name) }?.value
    }
}

/// A failed request, with a code a caller can sort on (retry a timeout, give up on a bad URL).
public struct HTTPClientError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case invalidURL
        case resolveFailed
        case connectFailed
        case tlsFailed
        case timedOut
        case connectionClosed
        case malformedResponse
        case cancelled
        case shutDown
    }

    public var code: Code
    public var message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code.rawValue): \(message)" }
}

/// An HTTP/1.1 client for many requests in flight at once: one event-loop thread (epoll) drives
/// every connection, connections are kept alive and reused per host, TLS goes through OpenSSL
/// with the system's trust store (or the CA file given). Thousands of slow requests cost a socket
/// each, not a thread or a timer each.
public final class HTTPClient: Sendable {
    public struct Configuration: Sendable {
        /// Open connections per host (scheme, host, port) at most; further requests wait for one.
        public var maxConnectionsPerHost: Int
        /// How long an unused kept-alive connection stays open.
        public var idleTimeout: TimeInterval
        /// Extra trusted roots (PEM file) for HTTPS; the system's are always used too.
        public var caFile: String?
        /// Largest response body accepted.
        public var maxResponseBytes: Int
        public var userAgent: String
        /// Connections kept open in all at most now (plus `openSlack`), when that varies (the descriptors a process's
        /// clients leave): an answered connection past it is closed rather than kept idle, and idle ones past it close
        /// within 50 ms, each pool's oldest first. Requests in progress are never cut; nil keeps every idle connection
        /// for `idleTimeout`.
        public var openAtMost: (@Sendable () -> Int)?
        /// How far past `openAtMost` connections stay open: clients connecting and leaving one by one move the bound by
        /// one each, and without slack every call to Apple then needs a new connection (and TLS handshake).
        public var openSlack = 64
        /// Whether `http://` hosts are first tried over HTTP/2 with prior knowledge (RFC 9113 §3.3): many requests share a
        /// few connections, each up to the server's limit of streams. A host that answers the preface as HTTP/1 is served
        /// over HTTP/1.1 from then on, the requests on that connection sent again that way (it never read them as requests).
        /// Off by default: for hosts known to speak it (the purchase server's calls to Apple's endpoints), not for any URL.
        public var http2PriorKnowledge = false

        public init(maxConnectionsPerHost: Int = 8192, idleTimeout: TimeInterval = 30, caFile: String? = nil,
                    maxResponseBytes: Int = 64 << 20, userAgent: String = "storekeeper", http2PriorKnowledge: Bool = false) {
            self.http2PriorKnowledge = http2PriorKnowledge
            self.maxConnectionsPerHost = maxConnectionsPerHost
            self.idleTimeout = idleTimeout
            self.caFile = caFile
            self.maxResponseBytes = maxResponseBytes
            self.userAgent = userAgent
        }
    }

    let configuration: Configuration
    private let loop: EventLoop
    private let resolver = Resolver()

    /// Creates a client and starts its event-loop thread; throws when TLS cannot be set up.
    public init(configuration: Configuration = Configuration()) throws(HTTPClientError) {
        self.configuration = configuration
        let tls = try TLSContext(caFile: configuration.caFile)
        loop = try EventLoop(configuration: configuration, tls: tls)
    }

    deinit { loop.shutdown() }

    /// Requests the event loop holds on a connection now (sent or being sent, not yet answered).
    var requestsOnConnections: Int { loop.requestsOnConnections.load(ordering: .relaxed) }

    /// Requests on HTTP/2 streams now (sent or being sent, not yet answered): they hold no connection of their own.
    public var requestsOnHTTP2: Int { loop.requestsOnHTTP2.load(ordering: .relaxed) }

    /// Connections the event loop holds open now, in use or idle.
    var openConnections: Int { loop.openConnections.load(ordering: .relaxed) }

    /// Connections the event loop has opened since the client was made.
    var connectionsOpened: Int { loop.connectionsOpened.load(ordering: .relaxed) }

    /// Stops the event loop; requests in flight fail with `shutDown`.
    public func shutdown() { loop.shutdown() }

    /// Sends one request and returns the whole response, or throws within `timeout` seconds.
    /// The body is consumed: once the request's bytes are made, they are its only copy while the answer is awaited.
    public func send(_ method: String, _ url: URL, headers: [(String, String)] = [], body: consuming [UInt8] = [],
                     timeout: TimeInterval) async throws(HTTPClientError) -> HTTPClientResponse {
        guard let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https", let host = url.host, !host.isEmpty else {
            throw HTTPClientError(.invalidURL, "not an http(s) URL: \(url.absoluteString)")
        }
        let secure = scheme == "https"
        let port = url.port ?? (secure ? 443 : 80)
        guard (1...65535).contains(port) else { throw HTTPClientError(.invalidURL, "port \(port) is outside 1…65535") }
        // At most a day, and never NaN or infinite: the nanoseconds must fit UInt64.
        let seconds = timeout.isFinite ? min(max(0, timeout), 86_400) : 86_400
        let deadline = Monotonic.now + UInt64(seconds * 1e9)
        let address = try await resolver.resolve(host, port: port)
        guard Monotonic.now < deadline else { throw HTTPClientError(.timedOut, "timed out resolving \(host)") }
        // Handed over in a box the continuation's closure empties: a local array would be kept by this async frame
        // until the answer, and the event loop could not let the bytes go once they are sent.
        let bodyCount = body.count
        let request = Handover(RequestBytes.make(method: method, url: url, host: host, port: port, secure: secure, headers: headers,
                                                 body: body, userAgent: configuration.userAgent))
        _ = consume body
        let fields = configuration.http2PriorKnowledge && !secure
            ? RequestBytes.http2Fields(method: method, url: url, host: host, port: port, headers: headers, bodyCount: bodyCount,
                                       userAgent: configuration.userAgent)
            : nil
        let key = PoolKey(host: host, port: port, secure: secure)
        let id = loop.nextID()
        do {
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { continuation in
                    guard let bytes = request.take() else {
                        continuation.resume(throwing: HTTPClientError(.shutDown, "the request was already sent"))
                        return
                    }
                    loop.submit(PendingRequest(id: id, key: key, address: address, bytes: bytes, deadline: deadline, continuation: continuation,
                                               http2Fields: fields, bodyStart: bytes.count - bodyCount))
                }
            } onCancel: {
                loop.cancel(id)
            }
        } catch let error as HTTPClientError {
            throw error
        } catch {
            throw HTTPClientError(.connectFailed, String(describing: error))
        }
    }
}

/// A value passed to exactly one taker, after which the box no longer holds it.
final class Handover<Value>: @unchecked Sendable {  // taken once, by the closure that runs once
    private var value: Value?

    init(_ value: consuming Value) { self.value = value }

    func take() -> Value? {
        defer { value = nil }
        return value
    }
}

/// The request as it goes on the wire.
enum RequestBytes {
    /// The request's fields for HTTP/2: pseudo-headers, then the caller's in lower case (those HTTP/2 forbids left out).
    static func http2Fields(method: String, url: URL, host: String, port: Int, headers: [(String, String)], bodyCount: Int,
                            userAgent: String) -> [(String, String)] {
        var target = url.path.isEmpty ? "/" : url.path
        if let query = url.query { target += "?" + query }
        let hostText = host.contains(":") ? "[\(host)]" : host
        var fields = [(":method", method), (":scheme", "http"), (":authority", port == 80 ? hostText : "\(hostText):\(port)"), (":path", target),
                      ("user-agent", userAgent)]
        if bodyCount > 0 || method == "POST" || method == "PUT" || method == "PATCH" { fields.append(("content-length", String(bodyCount))) }
        for (name, value) in headers {
            let lowered = name.lowercased()
            guard !["content-length", "host", "user-agent", "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te"].contains(lowered)
            else { continue }
            fields.append((lowered, value))
        }
        return fields
    }

    static func make(method: String, url: URL, host: String, port: Int, secure: Bool, headers: [(String, String)], body: [UInt8],
                     userAgent: String) -> [UInt8] {
        var target = url.path.isEmpty ? "/" : url.path
        if let query = url.query { target += "?" + query }
        let defaultPort = secure ? 443 : 80
        let hostHeader = host.contains(":") ? "[\(host)]" : host
        var head = "\(method) \(target) HTTP/1.1\r\nHost: \(hostHeader)\(port == defaultPort ? "" : ":\(port)")\r\n"
        head += "User-Agent: \(userAgent)\r\n"
        if !body.isEmpty || method == "POST" || method == "PUT" || method == "PATCH" { head += "Content-Length: \(body.count)\r\n" }
        for (name, value) in headers where !name.caseInsensitiveEquals("content-length") && !name.caseInsensitiveEquals("host") {
            head += "\(name): \(value)\r\n"
        }
        head += "\r\n"
        var bytes = Array(head.utf8)
        bytes.append(contentsOf: body)
        return bytes
    }
}

