import Foundation
#if canImport(Glibc)
import Glibc
#endif
import HTTP
@testable import HTTPClient
@testable import HTTPServer
import Synchronization
import Testing

/// HTTP/2 over cleartext with prior knowledge: the server's front hands connections that begin with the preface to the
/// HTTP/2 service, and the client tries it first for `http://` hosts.
@Suite("HTTP/2", .serialized)
struct HTTP2Tests {
    /// Answers by path: `/echo` now, `/later` as a task, `/held` after 300 ms, `/sleep?ms=` as a task that sleeps;
    /// `/refused` is refused at admission; every request is counted.
    final class Answers: Responder {
        let seen = Atomic<Int>(0)
        let refusals = Atomic<Int>(0)

        func admit(_ head: RequestHead) -> Admission {
            head.path == "/refused" ? .refuse(HTTPError(.unauthorized, code: "no", message: "refused").response) : .accept(bodyLimit: 64 << 10)
        }

        func refused(_ request: Request, with response: Response) { refusals.add(1, ordering: .relaxed) }

        func respondPromptly(to request: Request) -> PromptAnswer {
            seen.add(1, ordering: .relaxed)
            let echo = Response(status: .ok, headers: ["Content-Type": "application/octet-stream", "X-Path": request.path,
                                                       "X-Query": request.query["q"] ?? "", "Connection": "keep-alive"], body: request.body)
            switch request.path {
            case "/echo": return .now(echo)
            case "/later": return .later { echo }
            case "/held": return .after(.milliseconds(300)) { .now(echo) }
            case "/sleep":
                let ms = Int(request.query["ms"] ?? "0") ?? 0
                return .later {
                    try? await Task.sleep(for: .milliseconds(ms))
                    return .text("slept")
                }
            default: return .now(HTTPError(.notFound, code: "not_found", message: "no").response)
            }
        }

        func respond(to request: Request) async -> Response { .text("unused") }
    }

    static func makeServer(_ answers: Answers) throws -> (HTTPServer, URL, URL) {
        // The front (and with it HTTP/2) comes with interception, which needs a certificate.
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("http2-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let cert = directory.appendingPathComponent("cert.pem").path
        let key = directory.appendingPathComponent("key.pem").path
        try HTTPClientTests.run("/usr/bin/openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                                                     "-subj", "/CN=localhost", "-keyout", key, "-out", cert])
        var configuration = HTTPServer.Configuration(port: 0, accessLog: false)
        configuration.interception = .init(hosts: ["localhost"], certificateChainPEM: try String(contentsOfFile: cert, encoding: .utf8),
                                           privateKeyPEM: try String(contentsOfFile: key, encoding: .utf8))
        let server = HTTPServer(configuration: configuration, responder: answers)
        let port = try server.start()
        return (server, URL(string: "http://127.0.0.1:\(port)")!, directory)
    }

    /// The service's held requests and bytes once they stop changing (the loop frees them as it reads the last frames).
    static func settled(_ server: HTTPServer) async throws -> (Int, Int) {
        let deadline = ContinuousClock.now + .seconds(5)
        while server.http2Held != (0, 0) && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        return server.http2Held
    }

    @Test("Hundreds of requests at once share one connection, each answered with its own body, by every kind of answer")
    func multiplexed() async throws {
        let answers = Answers()
        let (server, base, _) = try Self.makeServer(answers)
        let client = try HTTPClient(configuration: .init(http2PriorKnowledge: true))
        let paths = ["echo", "later", "held"]
        let results = try await withThrowingTaskGroup(of: (Int, HTTPClientResponse).self) { group in
            for index in 0..<300 {
                group.addTask {
                    let body = (0..<(index * 97 % 20_000)).map { UInt8(($0 + index) % 251) }
                    let url = URL(string: "\(base)/\(paths[index % 3])?q=\(index)")!
                    return (index, try await client.send("POST", url, body: body, timeout: 30))
                }
            }
            return try await group.reduce(into: [:]) { $0[$1.0] = $1.1 }
        }
        for index in 0..<300 {
            let response = try #require(results[index])
            #expect(response.status == 200)
            #expect(response.body == (0..<(index * 97 % 20_000)).map { UInt8(($0 + index) % 251) })
            #expect(response.header("x-path") == "/\(paths[index % 3])")
            #expect(response.header("x-query") == String(index))
            #expect(response.header("connection") == nil)  // HTTP/2 forbids it; the service leaves it out
        }
        #expect(answers.seen.load(ordering: .relaxed) == 300)
        #expect(client.connectionsOpened == 1)
        #expect(try await Self.settled(server) == (0, 0))
        #expect(client.requestsOnHTTP2 == 0)
        client.shutdown()
        await server.shutdown()
    }

    @Test("Admission refusals and bodies past the limit are answered on their stream; the connection goes on")
    func refusals() async throws {
        let answers = Answers()
        let (server, base, _) = try Self.makeServer(answers)
        let client = try HTTPClient(configuration: .init(http2PriorKnowledge: true))
        let refused = try await client.send("POST", URL(string: "\(base)/refused")!, body: Array(repeating: 1, count: 1000), timeout: 10)
        #expect(refused.status == 401)
        let large = try await client.send("POST", URL(string: "\(base)/echo")!, body: Array(repeating: 2, count: 200_000), timeout: 10)
        #expect(large.status == 413)
        #expect(String(decoding: large.body, as: UTF8.self).contains("payload_too_large"))
        let missing = try await client.send("GET", URL(string: "\(base)/nowhere")!, timeout: 10)
        #expect(missing.status == 404)
        let fine = try await client.send("POST", URL(string: "\(base)/echo")!, body: [1, 2, 3], timeout: 10)
        #expect(fine.body == [1, 2, 3])
        #expect(answers.refusals.load(ordering: .relaxed) == 2)
        #expect(client.connectionsOpened == 1)
        // Everything answered: nothing held of the service's budget (a refused body's bytes included).
        #expect(try await Self.settled(server) == (0, 0))
        client.shutdown()
        await server.shutdown()
    }

    @Test("A call past its deadline resets its own stream only: the call beside it on the same connection is answered")
    func deadlineResetsStream() async throws {
        let (server, base, _) = try Self.makeServer(Answers())
        let client = try HTTPClient(configuration: .init(http2PriorKnowledge: true))
        let slow = Task { try await client.send("GET", URL(string: "\(base)/sleep?ms=3000")!, timeout: 0.5) }
        let patient = Task { try await client.send("GET", URL(string: "\(base)/sleep?ms=1000")!, timeout: 20) }
        await #expect(throws: HTTPClientError.self) { try await slow.value }
        #expect(try await patient.value.status == 200)
        #expect(client.connectionsOpened == 1)
        client.shutdown()
        await server.shutdown()
    }

    @Test("A host that does not speak HTTP/2 is served over HTTP/1.1 after one try, and no request is answered twice")
    func fallsBack() async throws {
        let answers = Answers()
        let server = HTTPServer(configuration: .init(port: 0, accessLog: false), responder: answers)  // libmicrohttpd alone
        let port = try server.start()
        let client = try HTTPClient(configuration: .init(http2PriorKnowledge: true))
        let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
            for index in 0..<20 {
                group.addTask { try await client.send("POST", URL(string: "http://127.0.0.1:\(port)/echo?q=\(index)")!, body: [UInt8(index)], timeout: 20).status }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(statuses == Array(repeating: 200, count: 20))
        #expect(answers.seen.load(ordering: .relaxed) == 20)
        #expect(client.requestsOnHTTP2 == 0)
        client.shutdown()
        await server.shutdown()
    }

    @Test("A connection that sends the preface then garbage is closed; oversized header blocks are refused; the service goes on")
    func hostile() async throws {
        let answers = Answers()
        let (server, base, _) = try Self.makeServer(answers)
        let port = UInt16(base.port!)
        let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)
        // A frame header claiming 16 MiB of an unknown type on stream 0, then nothing: the server must answer with GOAWAY
        // and close, not wait for the bytes.
        let garbage: [UInt8] = [0xff, 0xff, 0xff, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00]
        let answer = try await InterceptionTests.exchange(port, preface + garbage)
        #expect(answer.utf8.count < 200)
        // Headers past the bound: the stream is reset, the call fails, and no request reached the responder.
        let client = try HTTPClient(configuration: .init(http2PriorKnowledge: true))
        let huge = String(repeating: "x", count: 70_000)
        await #expect(throws: HTTPClientError.self) {
            try await client.send("GET", URL(string: "\(base)/echo")!, headers: [("x-huge", huge)], timeout: 10)
        }
        #expect(answers.seen.load(ordering: .relaxed) == 0)
        let fine = try await client.send("POST", URL(string: "\(base)/echo")!, body: [9], timeout: 10)
        #expect(fine.body == [9])
        client.shutdown()
        await server.shutdown()
    }

    @Test("A call the client gives up on cancels the task answering it, and what its request held is let go")
    func resetCancelsTask() async throws {
        let (server, base, _) = try Self.makeServer(Answers())
        let client = try HTTPClient(configuration: .init(http2PriorKnowledge: true))
        let started = ContinuousClock.now
        await #expect(throws: HTTPClientError.self) {
            try await client.send("GET", URL(string: "\(base)/sleep?ms=20000")!, timeout: 0.3)
        }
        // The task would sleep 20 s; cancelled with its stream, it ends at once.
        while server.requestsInFlight > 0 && ContinuousClock.now - started < .seconds(10) { try await Task.sleep(for: .milliseconds(20)) }
        #expect(server.requestsInFlight == 0)
        #expect(ContinuousClock.now - started < .seconds(10))
        #expect(try await Self.settled(server) == (0, 0))
        client.shutdown()
        await server.shutdown()
    }

    @Test("Shutdown ends HTTP/2 requests still answering: cancelled after the grace, connections closed")
    func shutdownEndsStreams() async throws {
        let (server, base, _) = try Self.makeServer(Answers())
        let client = try HTTPClient(configuration: .init(http2PriorKnowledge: true))
        let call = Task { try await client.send("GET", URL(string: "\(base)/sleep?ms=30000")!, timeout: 60) }
        while server.requestsInFlight == 0 { try await Task.sleep(for: .milliseconds(10)) }
        let started = ContinuousClock.now
        await server.shutdown(grace: .milliseconds(200))
        #expect(ContinuousClock.now - started < .seconds(8))
        // Cancelled, the handler answers at once, and that answer is sent before the connection closes (or the call fails).
        let outcome = try? await call.value
        #expect(outcome == nil || outcome?.status == 200)
        #expect(server.requestsInFlight == 0)
        client.shutdown()
    }

    @Test("A connection that sends only `P` is looked at again every 10 ms, not in a spin, then served as HTTP/1.1 when the rest comes")
    func partialPrefix() async throws {
        let (server, base, _) = try Self.makeServer(Answers())
        let port = UInt16(base.port!)
        let (answer, peeks) = try await InterceptionTests.offPool { () -> (String, Int) in
            let fd = try InterceptionTests.connected(port)
            defer { close(fd) }
            _ = send(fd, "P", 1, Int32(MSG_NOSIGNAL))
            Thread.sleep(forTimeInterval: 0.05)
            let before = server.frontPeeks
            Thread.sleep(forTimeInterval: 1)
            let peeks = server.frontPeeks - before
            let rest = Array("OST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi".utf8)
            _ = rest.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            return (InterceptionTests.receive(fd), peeks)
        }
        #expect(answer.hasPrefix("HTTP/1.1 200"))
        #expect(answer.hasSuffix("hi"))
        // Every 10 ms is at most about 100 looks in the second; a poll on the readable socket would look thousands of times.
        #expect(peeks <= 150)
        #expect(peeks >= 1)
        await server.shutdown()
    }

    @Test("The path is decoded as HTTP/1.1's is: escapes that would move a segment or the query stay encoded")
    func pathDecoding() {
        #expect(HTTP2Path.decoded("/a%20b/c") == "/a b/c")
        #expect(HTTP2Path.decoded("/apps/%2F..%2Fadmin") == "/apps/%2F..%2Fadmin")
        #expect(HTTP2Path.decoded("/x%00y%3Fz%23w%25v") == "/x%00y%3Fz%23w%25v")
        #expect(HTTP2Path.decoded("/bad%zz%4") == "/bad%zz%4")
        #expect(HTTP2Path.decoded("/p%41th?q=%41") == "/pAth?q=%41")  // the query is left to Request
    }
}
