import Foundation
#if canImport(Glibc)
import Glibc
#endif
import HTTP
@testable import Clocks
@testable import HTTPClient
@testable import HTTPServer
import Synchronization
import Testing

@Suite("HTTP client against live servers", .serialized)
struct HTTPClientTests {
    static func makeServer(connectionTimeout: UInt32 = 30) throws -> (HTTPServer, URL) {
        var router = Router()
        router.on(.post, "/echo") { request in
            Response(status: .ok, headers: ["Content-Type": "application/octet-stream", "X-Method": request.method.rawValue], body: request.body)
        }
        router.on(.get, "/sleep") { request in
            try await Task.sleep(for: .milliseconds(Int(request.query["ms"] ?? "0") ?? 0))
            return .text("slept")
        }
        router.on(.get, "/status/:code") { request in
            Response(status: HTTPStatus(Int(request.parameters["code"] ?? "") ?? 500), headers: ["Content-Type": "text/html"],
                     body: Data("<html>down</html>".utf8))
        }
        let server = HTTPServer(configuration: .init(port: 0, connectionTimeout: connectionTimeout, accessLog: false), responder: router)
        let port = try server.start()
        return (server, URL(string: "http://127.0.0.1:\(port)")!)
    }

    @Test("POST bodies go and come back intact, with status and headers")
    func echo() async throws {
        let (server, base) = try Self.makeServer()
        let client = try HTTPClient()
        let payload = (0..<100_000).map { UInt8($0 % 251) }
        let response = try await client.send("POST", base.appendingPathComponent("echo"), headers: [("Content-Type", "application/json")],
                                             body: payload, timeout: 60)
        #expect(response.status == 200)
        #expect(response.body == payload)
        #expect(response.header("x-method") == "POST")
        let error = try await client.send("GET", base.appendingPathComponent("status/503"), timeout: 60)
        #expect(error.status == 503)
        #expect(error.header("Content-Type") == "text/html")
        client.shutdown()
        await server.shutdown()
    }

    @Test("Many requests in flight over few kept-alive connections all get their own answers")
    func concurrency() async throws {
        let (server, base) = try Self.makeServer()
        let client = try HTTPClient(configuration: .init(maxConnectionsPerHost: 4))
        let answers = try await withThrowingTaskGroup(of: (Int, [UInt8]).self) { group in
            for index in 0..<300 {
                group.addTask {
                    let body = Array("request \(index)".utf8)
                    let response = try await client.send("POST", base.appendingPathComponent("echo"), body: body, timeout: 60)
                    return (index, response.body)
                }
            }
            return try await group.reduce(into: [Int: [UInt8]]()) { $0[$1.0] = $1.1 }
        }
        #expect(answers.count == 300)
        #expect(answers.allSatisfy { String(decoding: $0.value, as: UTF8.self) == "request \($0.key)" })
        client.shutdown()
        await server.shutdown()
    }

    @Test("A slow server times out with .timedOut; a closed port fails with .connectFailed")
    func failures() async throws {
        let (server, base) = try Self.makeServer()
        let client = try HTTPClient()
        await #expect(throws: HTTPClientError(.timedOut, "no answer from 127.0.0.1 in time")) {
            try await client.send("GET", URL(string: base.absoluteString + "/sleep?ms=3000")!, timeout: 0.3)
        }
        // Calls that time out are forgotten with their connections (a timed-out call's connection stayed in the
        // loop's table of requests, with its buffers, for as long as the client lived).
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<5 {
                group.addTask { _ = try? await client.send("GET", URL(string: base.absoluteString + "/sleep?ms=3000")!, timeout: 0.3) }
            }
        }
        #expect(client.requestsOnConnections == 0)
        let port = server.port
        await server.shutdown()
        do {
            _ = try await client.send("GET", URL(string: "http://127.0.0.1:\(port)/sleep")!, timeout: 5)
            Issue.record("a request to a closed port succeeded")
        } catch {
            #expect(error.code == .connectFailed)
        }
        await #expect(throws: HTTPClientError.self) { try await client.send("GET", URL(string: "ftp://127.0.0.1/x")!, timeout: 1) }
        client.shutdown()
    }

    @Test("Calls with different timeouts each end at their own deadline, and one that outlives them is answered")
    func deadlines() async throws {
        let (server, base) = try Self.makeServer()
        let client = try HTTPClient()
        // Seconds apart on each side of the answer's 2 s, so a loaded machine cannot move a call across it.
        let slow = URL(string: base.absoluteString + "/sleep?ms=2000")!
        let outcomes = await withTaskGroup(of: (Double, String).self) { group in
            for timeout in [10, 0.5, 0.2, 6] {
                group.addTask {
                    do {
                        return (timeout, "\(try await client.send("GET", slow, timeout: timeout).status)")
                    } catch {
                        return (timeout, (error as? HTTPClientError)?.code.rawValue ?? "\(error)")
                    }
                }
            }
            return await group.reduce(into: [Double: String]()) { $0[$1.0] = $1.1 }
        }
        #expect(outcomes == [0.2: "timedOut", 0.5: "timedOut", 6: "200", 10: "200"])
        #expect(client.requestsOnConnections == 0)
        client.shutdown()
        await server.shutdown()
    }

    @Test("A call queued for a connection times out at its own deadline, even when the call ahead of it ends in the same sweep")
    func queuedDeadline() async throws {
        let (server, base) = try Self.makeServer()
        let client = try HTTPClient(configuration: .init(maxConnectionsPerHost: 1))
        let slow = URL(string: base.absoluteString + "/sleep?ms=6000")!
        let firstStarted = ContinuousClock.now
        async let first: HTTPClientError.Code? = {
            do { _ = try await client.send("GET", slow, timeout: 0.6); return nil } catch { return (error as? HTTPClientError)?.code }
        }()
        try await Task.sleep(for: .milliseconds(200))
        // Queued behind the first call (one connection) and due 10 ms before it, so both usually fall due in one 50 ms
        // sweep: the first's connection, closed, must not carry the second to the server with no deadline left.
        let elapsed = Double((ContinuousClock.now - firstStarted).components.attoseconds) / 1e18
            + Double((ContinuousClock.now - firstStarted).components.seconds)
        let started = ContinuousClock.now
        await #expect(throws: HTTPClientError.self) { try await client.send("GET", slow, timeout: max(0.05, 0.59 - elapsed)) }
        #expect(ContinuousClock.now - started < .seconds(4))
        #expect(await first == .timedOut)
        #expect(client.requestsOnConnections == 0)
        client.shutdown()
        await server.shutdown()
    }

    @Test("Connections are kept open only up to what openAtMost allows now: answered ones past it close, idle ones past it close soon")
    func openConnectionsFollowTheirBound() async throws {
        let (server, base) = try Self.makeServer()
        let allowed = Atomic<Int>(100)
        var configuration = HTTPClient.Configuration(idleTimeout: 600)
        configuration.openAtMost = { allowed.load(ordering: .relaxed) }
        configuration.openSlack = 1
        let client = try HTTPClient(configuration: configuration)
        let slow = URL(string: base.absoluteString + "/sleep?ms=500")!
        func overlapping(_ count: Int) async throws {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<count { group.addTask { _ = try await client.send("GET", slow, timeout: 10) } }
                try await group.waitForAll()
            }
        }
        // Within the bound, answered connections stay open, idle, for reuse.
        try await overlapping(6)
        #expect(client.connectionsOpened == 6)
        #expect(client.openConnections == 6)
        // The bound falls to 2 (3 with the slack): idle connections past it close within a sweep or two, long before
        // their idle timeout.
        allowed.store(2, ordering: .relaxed)
        let deadline = ContinuousClock.now + .seconds(5)
        while client.openConnections > 3 && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(20)) }
        #expect(client.openConnections == 3)
        // Requests in flight are never cut: five run at once, and once answered only three connections stay.
        try await overlapping(5)
        #expect(client.openConnections <= 3)
        client.shutdown()
        await server.shutdown()
    }

    @Test("Idle kept-alive connections are closed once they have been idle for the idle timeout")
    func idleConnectionsClose() async throws {
        let (server, base) = try Self.makeServer()
        // Windows wide enough for a loaded machine: three calls overlap for a second; a connection idles for 3 s.
        let client = try HTTPClient(configuration: .init(idleTimeout: 3))
        let slow = URL(string: base.absoluteString + "/sleep?ms=1000")!, quick = URL(string: base.absoluteString + "/sleep?ms=0")!
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<3 { group.addTask { _ = try await client.send("GET", slow, timeout: 10) } }
            try await group.waitForAll()
        }
        #expect(client.connectionsOpened == 3)
        _ = try await client.send("GET", quick, timeout: 10)  // one of them reused, idle again from now
        #expect(client.connectionsOpened == 3)
        try await Task.sleep(for: .seconds(5))
        #expect(client.openConnections == 0)
        // Counted, not looked at: on a loaded machine the new connection may already have idled out.
        let opened = client.connectionsOpened
        _ = try await client.send("GET", quick, timeout: 10)
        #expect(client.connectionsOpened == opened + 1)
        client.shutdown()
        await server.shutdown()
    }

    @Test("The deadline heap gives back due ids soonest first, and keeps only live ones when asked")
    func deadlineHeap() {
        var heap = DeadlineHeap()
        var generator = SystemRandomNumberGenerator()
        let deadlines = (0..<500).map { _ in UInt64.random(in: 1..<1_000, using: &generator) }
        for (id, deadline) in deadlines.enumerated() { heap.push(deadline: deadline, id: UInt64(id)) }
        #expect(heap.popDue(now: 0) == nil)
        heap.removeAll { $0 % 2 == 0 }
        #expect(heap.count == 250)
        var popped: [UInt64] = []
        while let id = heap.popDue(now: 500) { popped.append(id) }
        let expected = deadlines.enumerated().filter { $0.offset % 2 == 0 && $0.element <= 500 }
        #expect(popped.count == expected.count)
        #expect(popped.map { deadlines[Int($0)] } == popped.map { deadlines[Int($0)] }.sorted())
        #expect(Set(popped) == Set(expected.map { UInt64($0.offset) }))
        while heap.popDue(now: .max) != nil {}
        #expect(heap.count == 0)
    }

    @Test("A kept-alive connection the server closed while idle is replaced, not reported as a failure")
    func staleConnection() async throws {
        let (server, base) = try Self.makeServer(connectionTimeout: 1)
        let client = try HTTPClient(configuration: .init(maxConnectionsPerHost: 1))
        let first = try await client.send("GET", URL(string: base.absoluteString + "/sleep?ms=0")!, timeout: 5)
        try await Task.sleep(for: .milliseconds(1800))
        let second = try await client.send("GET", URL(string: base.absoluteString + "/sleep?ms=0")!, timeout: 5)
        #expect(first.status == 200 && second.status == 200)
        client.shutdown()
        await server.shutdown()
    }

    /// A raw HTTP/1.1 server on loopback for connection-level scripts: it answers every request `200 ok`, except the
    /// second request of the first connection, after which it waits `closeAfter` and closes without answering.
    /// Counts the requests it read.
    final class ScriptedServer: @unchecked Sendable {
        final class Count: Sendable { let value = Atomic<Int>(0) }
        let port: UInt16
        let count = Count()
        var requests: Int { count.value.load(ordering: .relaxed) }
        private let listener: Int32

        init(closeAfter: Duration) throws {
            let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            self.listener = listener
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let bound = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) == 0 && getsockname(listener, $0, &length) == 0 }
            }
            guard bound, listen(listener, 16) == 0 else { throw HTTPClientError(.connectFailed, "test server") }
            port = UInt16(bigEndian: address.sin_port)
            let requests = count
            Thread.detachNewThread {
                var connections = 0
                while true {
                    let fd = accept(listener, nil, nil)
                    guard fd >= 0 else { return }
                    connections += 1
                    let first = connections == 1
                    Thread.detachNewThread {
                        var buffer = [UInt8](repeating: 0, count: 4096), pending: [UInt8] = [], served = 0
                        while true {
                            let count = recv(fd, &buffer, buffer.count, 0)
                            guard count > 0 else { break }
                            pending += buffer[0..<count]
                            while let end = pending.firstRange(of: Array("\r\n\r\n".utf8)) {
                                pending.removeSubrange(0..<end.upperBound)
                                requests.value.add(1, ordering: .relaxed)
                                served += 1
                                if first && served == 2 {
                                    Thread.sleep(forTimeInterval: Double(closeAfter.components.seconds) + Double(closeAfter.components.attoseconds) / 1e18)
                                    close(fd)
                                    return
                                }
                                let answer = Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".utf8)
                                _ = send(fd, answer, answer.count, Int32(MSG_NOSIGNAL))
                            }
                        }
                        close(fd)
                    }
                }
            }
        }

        func stop() { shutdown(listener, Int32(SHUT_RDWR)); close(listener) }
    }

    @Test("A kept-alive connection closed right after the request is sent gets the request once more, on a new connection")
    func closedAtOnce() async throws {
        let server = try ScriptedServer(closeAfter: .zero)
        defer { server.stop() }
        let client = try HTTPClient(configuration: .init(maxConnectionsPerHost: 1))
        let url = URL(string: "http://127.0.0.1:\(server.port)/")!
        #expect(try await client.send("GET", url, timeout: 5).status == 200)
        #expect(try await client.send("GET", url, timeout: 5).status == 200)
        #expect(server.requests == 3)
        client.shutdown()
    }

    @Test("A request the server held past a second and then dropped is not sent again (its bytes were let go): it fails, and the caller retries")
    func closedLater() async throws {
        // Held 4 s: well past the second after which the client lets the bytes go, even if its loop runs late.
        let server = try ScriptedServer(closeAfter: .seconds(4))
        defer { server.stop() }
        let client = try HTTPClient(configuration: .init(maxConnectionsPerHost: 1))
        let url = URL(string: "http://127.0.0.1:\(server.port)/")!
        #expect(try await client.send("GET", url, timeout: 10).status == 200)
        await #expect(throws: HTTPClientError.self) { try await client.send("GET", url, timeout: 10) }
        #expect(server.requests == 2)
        // The failed call is forgotten with its connection (it stayed in the loop's table of requests).
        #expect(client.requestsOnConnections == 0)
        client.shutdown()
    }

    @Test("With more than 512 connections waiting on their handlers, every answer still arrives (resumes handed back in batches)")
    func manySuspended() async throws {
        var router = Router()
        router.on(.get, "/sleep") { request in
            try await Task.sleep(for: .milliseconds(Int(request.query["ms"] ?? "0") ?? 0))
            return .text("slept \(request.query["n"] ?? "")")
        }
        let server = HTTPServer(configuration: .init(port: 0, connectionLimit: 2000, accessLog: false), responder: router)
        let port = try server.start()
        let client = try HTTPClient(configuration: .init(maxConnectionsPerHost: 1000))
        let bodies = try await withThrowingTaskGroup(of: (Int, String).self) { group in
            for index in 0..<800 {
                group.addTask {
                    // Spread over 1.0–1.4 s, so answers come one after another while hundreds are still suspended
                    // (every request is connected and waiting long before the first answer, even on a loaded machine).
                    let url = URL(string: "http://127.0.0.1:\(port)/sleep?ms=\(1000 + index % 400)&n=\(index)")!
                    let response = try await client.send("GET", url, timeout: 60)
                    return (index, String(decoding: response.body, as: UTF8.self))
                }
            }
            return try await group.reduce(into: [Int: String]()) { $0[$1.0] = $1.1 }
        }
        #expect(bodies.count == 800)
        #expect(bodies.allSatisfy { $0.value == "slept \($0.key)" })
        #expect(server.resumes.batched.load(ordering: .relaxed) > 0, "no resume was batched: fewer than 512 were ever suspended")
        client.shutdown()
        await server.shutdown()
    }

    @Test("Resumes gather longer the more connections are suspended: 2 µs each, between 2 and 40 ms")
    func resumeDelay() {
        // libmicrohttpd walks every suspended connection per batch: the walks per second fall as the list grows.
        #expect(ResumeBatcher.delay(suspended: 513) == .microseconds(2_000))
        #expect(ResumeBatcher.delay(suspended: 9_000) == .microseconds(18_000))
        #expect(ResumeBatcher.delay(suspended: 20_000) == .microseconds(40_000))
        #expect(ResumeBatcher.delay(suspended: 1 << 20) == .microseconds(40_000))
    }

    @Test("Cancelling the calling task ends the request")
    func cancellation() async throws {
        let (server, base) = try Self.makeServer()
        let client = try HTTPClient()
        let task = Task { try await client.send("GET", URL(string: base.absoluteString + "/sleep?ms=5000")!, timeout: 30) }
        try await Task.sleep(for: .milliseconds(200))
        task.cancel()
        do {
            _ = try await task.value
            Issue.record("a cancelled request succeeded")
        } catch let error as HTTPClientError {
            #expect(error.code == .cancelled)
        }
        client.shutdown()
        await server.shutdown()
    }

    /// Ends a child process for good. `terminate()` sends SIGTERM, which a child of the test runner inherits blocked
    /// (it stays pending, and an `openssl s_server` outlived every test run): SIGKILL cannot be blocked.
    static func stop(_ process: Process) {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGKILL)
        process.waitUntilExit()
    }

    @Test("HTTPS: a server whose certificate chains to a trusted CA answers; an untrusted one is refused")
    func tls() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tls-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let cert = directory.appendingPathComponent("cert.pem").path
        let key = directory.appendingPathComponent("key.pem").path
        try Self.run("/usr/bin/openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                                          "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost", "-keyout", key, "-out", cert])
        // s_server cannot be told to pick a free port: take one the kernel just handed out, and start again
        // on another if the server exits (the port was taken meanwhile) — under a loaded test run too.
        let trusting = try HTTPClient(configuration: .init(caFile: cert))
        var response: HTTPClientResponse?
        var url = URL(string: "https://localhost/")!
        var server = Process()
        for _ in 0..<3 where response == nil {
            let port = try Self.freePort()
            server = Process()
            server.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            server.arguments = ["s_server", "-accept", "127.0.0.1:\(port)", "-cert", cert, "-key", key, "-www", "-quiet"]
            server.standardOutput = FileHandle.nullDevice
            server.standardError = FileHandle.nullDevice
            try server.run()
            url = URL(string: "https://localhost:\(port)/")!
            for _ in 0..<150 where response == nil && server.isRunning {  // until s_server listens (up to 15 s)
                response = try? await trusting.send("GET", url, timeout: 5)
                if response == nil { try await Task.sleep(for: .milliseconds(100)) }
            }
            if response == nil { Self.stop(server) }
        }
        defer { Self.stop(server) }
        #expect(response?.status == 200)
        let page = String(decoding: response?.body ?? [], as: UTF8.self)
        #expect(page.contains("s_server"))
        let strict = try HTTPClient()
        do {
            _ = try await strict.send("GET", url, timeout: 5)
            Issue.record("a self-signed certificate was accepted")
        } catch {
            #expect(error.code == .tlsFailed)
            #expect(error.message.contains("certificate"))
        }
        trusting.shutdown()
        strict.shutdown()
    }

    /// A loopback TCP port nobody listens on right now.
    static func freePort() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
        }
        guard bound else { throw HTTPClientError(.connectFailed, "no free port") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    static func run(_ tool: String, _ arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw HTTPClientError(.tlsFailed, "\(tool) failed") }
    }
}
