import Foundation
import HTTP
import HTTPClient
import HTTPServer
import Testing

/// The port that also terminates TLS and answers CONNECT for chosen host names (the emulator's proxy mode).
@Suite("Interception", .serialized)
struct InterceptionTests {
    /// A server intercepting `localhost` (resolvable without DNS), with a certificate made by openssl.
    static func makeServer(connectionLimit: UInt32 = 1024) throws -> (HTTPServer, port: UInt16, caFile: String, directory: URL) {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("intercept-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let cert = directory.appendingPathComponent("cert.pem").path
        let key = directory.appendingPathComponent("key.pem").path
        try HTTPClientTests.run("/usr/bin/openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                                                     "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-keyout", key, "-out", cert])
        var router = Router()
        router.on(.get, "/where") { request in .json(["host": request.host ?? "", "path": request.path, "tunnel": request.tunnel ?? "none"]) }
        router.on(.post, "/echo") { request in Response(status: .ok, headers: ["Content-Type": "application/octet-stream"], body: request.body) }
        var configuration = HTTPServer.Configuration(port: 0, connectionLimit: connectionLimit, accessLog: false)
        configuration.interception = .init(hosts: ["localhost"], certificateChainPEM: try String(contentsOfFile: cert, encoding: .utf8),
                                           privateKeyPEM: try String(contentsOfFile: key, encoding: .utf8))
        let server = HTTPServer(configuration: configuration, responder: router)
        let port = try server.start()
        return (server, port, cert, directory)
    }

    /// Runs blocking work on its own thread: the servers under test answer on the cooperative pool, which a
    /// blocked test thread would starve (two threads on this machine).
    static func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            Thread { continuation.resume(with: Result { try body() }) }.start()
        }
    }

    /// Sends `bytes` on a fresh connection and reads until the server closes (or 10 s pass), off the pool.
    static func exchange(_ port: UInt16, _ bytes: [UInt8]) async throws -> String {
        try await offPool { try blockingExchange(port, bytes) }
    }

    static func blockingExchange(_ port: UInt16, _ bytes: [UInt8]) throws -> String {
        let fd = try connected(port)
        defer { close(fd) }
        _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        return receive(fd) { $0.contains("Connection: close\r\n\r\n") && $0.utf8.count > 200 }
    }

    /// Reads from a blocking socket until the server closes it, or until `whole` says what arrived is the whole answer.
    static func receive(_ fd: Int32, until whole: (String) -> Bool = { _ in false }) -> String {
        var received: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = recv(fd, &buffer, buffer.count, 0)
            if count <= 0 { break }
            received += buffer.prefix(count)
            if whole(String(decoding: received, as: UTF8.self)) { break }
        }
        return String(decoding: received, as: UTF8.self)
    }

    /// A blocking socket connected to the port on 127.0.0.1, whose reads give up after 60 s (a whole test run shares two cores: an answer can wait seconds for a thread).
    static func connected(_ port: UInt16) throws -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = port.bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else {
            close(fd)
            throw HTTPClientError(.connectFailed, "cannot connect")
        }
        var timeout = timeval(tv_sec: 60, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        return fd
    }

    @Test("Plain HTTP, direct TLS and a CONNECT tunnel all reach the same responder on one port")
    func threeWays() async throws {
        let (server, port, caFile, directory) = try Self.makeServer()
        defer { try? FileManager.default.removeItem(at: directory) }
        let plain = try HTTPClient()
        let response = try await plain.send("GET", URL(string: "http://127.0.0.1:\(port)/where")!, timeout: 60)
        #expect(response.status == 200)
        #expect(String(decoding: response.body, as: UTF8.self).contains("\"tunnel\":\"none\""), "plain HTTP is not marked")
        // Direct TLS (what a hosts entry gives): the first byte is a handshake, not a method.
        let trusting = try HTTPClient(configuration: .init(caFile: caFile))
        let body = [UInt8]((0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        let echoed = try await trusting.send("POST", URL(string: "https://localhost:\(port)/echo")!, body: body, timeout: 60)
        #expect(echoed.status == 200 && echoed.body == body)
        let located = try await trusting.send("GET", URL(string: "https://localhost:\(port)/where")!, timeout: 60)
        #expect(String(decoding: located.body, as: UTF8.self).contains("\"host\":\"localhost\""))
        #expect(String(decoding: located.body, as: UTF8.self).contains("\"tunnel\":\"localhost\""), "direct TLS is marked with its SNI")
        // Through CONNECT, as HTTPS_PROXY clients do (curl here; it keeps localhost behind the proxy when told to).
        let curl = Process()
        curl.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        curl.arguments = ["-sS", "--max-time", "20", "--proxy", "http://127.0.0.1:\(port)", "--noproxy", "", "--cacert", caFile, "https://localhost/where"]
        let output = Pipe()
        curl.standardOutput = output
        curl.standardError = FileHandle.nullDevice
        let tunnelled = try await Self.offPool { () -> String in
            try curl.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            curl.waitUntilExit()
            return String(decoding: data, as: UTF8.self)
        }
        #expect(curl.terminationStatus == 0)
        #expect(tunnelled.contains("\"path\":\"/where\"") && tunnelled.contains("\"host\":\"localhost\""))
        #expect(tunnelled.contains("\"tunnel\":\"localhost\""), "a CONNECT tunnel is marked with its target")
        plain.shutdown()
        trusting.shutdown()
        await server.shutdown()
    }

    @Test("CONNECT to any other host or port, a malformed or oversized CONNECT are refused; other C methods are plain HTTP")
    func refusals() async throws {
        let (server, port, _, directory) = try Self.makeServer()
        defer { try? FileManager.default.removeItem(at: directory) }
        for target in ["example.com:443", "localhost:80", "localhost", "127.0.0.1:443", "LOCALHOST:4430"] {
            let answer = try await Self.exchange(port, Array("CONNECT \(target) HTTP/1.1\r\nHost: \(target)\r\n\r\n".utf8))
            #expect(answer.hasPrefix("HTTP/1.1 403 "), "\(target): \(answer.prefix(40))")
        }
        #expect(try await Self.exchange(port, Array("CONNECT localhost:443\r\n\r\n".utf8)).hasPrefix("HTTP/1.1 400 "))
        let huge = "CONNECT localhost:443 HTTP/1.1\r\n" + String(repeating: "X-Padding: \(String(repeating: "a", count: 100))\r\n", count: 100)
        #expect(try await Self.exchange(port, Array(huge.utf8)).hasPrefix("HTTP/1.1 431 "))
        // A NUL and binary after the method: still one refusal, no crash.
        #expect(try await Self.exchange(port, Array("CONNECT \u{0}\u{1}\u{FF} HTTP/1.1\r\n\r\n".utf8)).hasPrefix("HTTP/1.1 "))
        // COPY starts with C too, and is not CONNECT: libmicrohttpd answers it (here: no such route).
        let copy = try await Self.exchange(port, Array("COPY /where HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8))
        #expect(copy.hasPrefix("HTTP/1.1 4"))
        // A TLS handshake for a name not served is refused with an alert; the port goes on serving.
        let plain = try HTTPClient()
        #expect(try await plain.send("GET", URL(string: "http://127.0.0.1:\(port)/where")!, timeout: 60).status == 200)
        plain.shutdown()
        await server.shutdown()
    }

    @Test("More connections than the limit at once: the extra ones are closed and the server still answers afterwards",
          arguments: [true, false])
    func pastTheConnectionLimit(intercepting: Bool) async throws {
        // libmicrohttpd 0.9.75 leaves a polling thread holding its own lock when a connection handed to it (the way
        // the front hands every connection over) finds the connection limit reached: that thread never serves again.
        let limit: UInt32 = 16
        let server: HTTPServer, port: UInt16
        var directory: URL?
        defer { if let directory { try? FileManager.default.removeItem(at: directory) } }
        if intercepting {
            (server, port, _, directory) = try Self.makeServer(connectionLimit: limit)
        } else {
            var router = Router()
            router.on(.get, "/where") { _ in .json(["tunnel": "none"]) }
            server = HTTPServer(configuration: .init(port: 0, connectionLimit: limit, accessLog: false), responder: router)
            port = try server.start()
        }
        let answered = try await Self.offPool { () -> Int in
            var sockets: [Int32] = []
            defer { for socket in sockets { close(socket) } }
            for _ in 0..<(Int(limit) * 4) {
                let fd = try Self.connected(port)
                sockets.append(fd)
                _ = Array("GET /where HTTP/1.1\r\nHost: localhost\r\n\r\n".utf8).withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            }
            // Answers read until every connection is answered or closed, or a second after the first answer (those
            // past the limit may wait in the listen queue until an answered one closes); a busy machine may take
            // seconds to answer the first.
            var answered = 0
            var waiting = Set(sockets)
            var buffer = [UInt8](repeating: 0, count: 4096)
            var deadline = Date().addingTimeInterval(60)
            while !waiting.isEmpty && Date() < deadline {
                if answered > 0 { deadline = min(deadline, Date().addingTimeInterval(1)) }
                for fd in waiting {
                    let received = recv(fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                    if received > 0 && buffer.starts(with: Array("HTTP/1.1 200".utf8)) { answered += 1 }
                    if received >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK) { waiting.remove(fd) }
                }
                if !waiting.isEmpty { Thread.sleep(forTimeInterval: 0.05) }
            }
            return answered
        }
        #expect(answered >= 1 && answered <= Int(limit), "\(answered) answered at once")
        try await Task.sleep(for: .milliseconds(200))
        for _ in 0..<4 {
            let answer = try await Self.exchange(port, Array("GET /where HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".utf8))
            #expect(answer.hasPrefix("HTTP/1.1 200"), "after the burst: \(answer.prefix(40))")
        }
        await server.shutdown()
    }

    @Test("Shutdown stops the front: the port refuses connections afterwards")
    func shutdown() async throws {
        let (server, port, _, directory) = try Self.makeServer()
        defer { try? FileManager.default.removeItem(at: directory) }
        await server.shutdown()
        try await Task.sleep(for: .milliseconds(100))
        await #expect(throws: (any Error).self) { try await Self.exchange(port, Array("GET / HTTP/1.1\r\n\r\n".utf8)) }
    }
}

/// Percent-escapes are decoded once, and never into something that moves a path's boundaries.
@Suite("Escapes in request targets")
struct EscapeTests {
    @Test("%00, %2F, %3F, %23 and %25 stay inside their segment; query values decode exactly once")
    func escapes() async throws {
        var router = Router()
        router.on(.get, "/items/:id/detail") { request in .json(["id": request.parameters["id"] ?? "", "q": request.query["q"] ?? ""]) }
        router.on(.get, "/items") { _ in .json(["listing": "all"]) }
        let server = HTTPServer(configuration: .init(port: 0, accessLog: false), responder: router)
        let port = try server.start()
        // A raw request line: URL types and clients normalise escapes, a hostile client does not.
        func get(_ target: String) async throws -> (Int, [String: String]) {
            let answer = try await InterceptionTests.exchange(port, Array("GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".utf8))
            let status = Int(answer.split(separator: " ").dropFirst().first ?? "") ?? 0
            let body = answer.components(separatedBy: "\r\n\r\n").dropFirst().joined()
            return (status, (try? JSONDecoder().decode([String: String].self, from: Data(body.utf8))) ?? [:])
        }
        for (escaped, decoded) in [("%00", "\u{0}"), ("%2F", "/"), ("%3F", "?"), ("%23", "#"), ("a%2Fb", "a/b"), ("%2541", "%41"), ("%41", "A")] {
            let (status, body) = try await get("/items/\(escaped)/detail")
            #expect(status == 200 && body["id"] == decoded, "\(escaped) → \(body)")
        }
        let (status, body) = try await get("/items/x/detail?q=a%2Fb%3Fc%26d%2541%00e")
        #expect(status == 200 && body["q"] == "a/b?c&d%41\u{0}e")
        // Before, %00 cut the path short and %3F split it: both reached /items.
        #expect(try await get("/items/%00").1["listing"] == nil)
        await server.shutdown()
    }
}
