import Foundation
import Locking
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif
import HTTP
@testable import HTTPServer
import Synchronization
import Testing

/// A one-way switch shared by handlers of the concurrency test.
final class Gate: Sendable {
    static let shared = Gate()
    private let flag = Locked(false)
    var isOpen: Bool { flag.withLock { $0 } }
    func open() { flag.withLock { $0 = true } }
}

@Suite("libmicrohttpd server, live on 127.0.0.1:0", .serialized)
struct HTTPServerTests {
    static func makeServer(maxBody: Int = 1024) throws -> (HTTPServer, URL) {
        var router = Router()
        router.on(.post, "/echo") { request in Response(status: .ok, headers: ["Content-Type": "application/octet-stream"], body: request.body) }
        router.on(.get, "/slow") { _ in
            // Long enough for a poll every 10 ms to see it in flight on a loaded machine, shorter than shutdown's grace.
            try await Task.sleep(for: .milliseconds(2000))
            return .text("slow")
        }
        router.on(.get, "/fast") { request in .text("fast \(request.query["n"] ?? "")") }
        router.on(.get, "/drop") { _ in .drop }
        router.on(.get, "/wait-for-release") { _ in
            while !Gate.shared.isOpen { try await Task.sleep(for: .milliseconds(5)) }
            return .text("released")
        }
        router.on(.post, "/release") { _ in
            Gate.shared.open()
            return .text("ok")
        }
        let server = HTTPServer(configuration: .init(port: 0, maxBodySize: maxBody, accessLog: false), responder: router)
        let port = try server.start()
        return (server, URL(string: "http://127.0.0.1:\(port)")!)
    }

    static func fetch(_ url: URL, method: String = "GET", body: Data? = nil) async throws -> (Int, Data) {
        var request = URLRequest(url: url)
        request.httpMethod = method
        request.httpBody = body
        request.timeoutInterval = 60
        let (data, response) = try await URLSession.shared.data(for: request)
        return ((response as? HTTPURLResponse)?.statusCode ?? 0, data)
    }

    @Test("Port 0 binds a free port and bodies are echoed intact")
    func echo() async throws {
        let (server, base) = try Self.makeServer()
        #expect(server.port > 0)
        let payload = Data((0..<1000).map { UInt8($0 % 251) })
        let (status, data) = try await Self.fetch(base.appendingPathComponent("echo"), method: "POST", body: payload)
        #expect(status == 200)
        #expect(data == payload)
        await server.shutdown()
    }

    @Test("Bodies over the limit answer 413")
    func tooLarge() async throws {
        let (server, base) = try Self.makeServer(maxBody: 1024)
        let (status, data) = try await Self.fetch(base.appendingPathComponent("echo"), method: "POST", body: Data(count: 4096))
        #expect(status == 413)
        #expect(String(decoding: data, as: UTF8.self).contains("payload_too_large"))
        await server.shutdown()
    }

    @Test("Handlers waiting on each other do not block libmicrohttpd's threads")
    func concurrency() async throws {
        let (server, base) = try Self.makeServer()
        // More waiting handlers than libmicrohttpd has threads: if handlers held its threads, the
        // release request could never be read and the waiters would time out.
        try await withThrowingTaskGroup(of: String.self) { group in
            for _ in 0..<4 {
                group.addTask { String(decoding: try await Self.fetch(base.appendingPathComponent("wait-for-release")).1, as: UTF8.self) }
            }
            try await Task.sleep(for: .milliseconds(100))
            let (status, _) = try await Self.fetch(base.appendingPathComponent("release"), method: "POST", body: Data())
            #expect(status == 200)
            for try await answer in group { #expect(answer == "released") }
        }
        await server.shutdown()
    }

    @Test("A dropped connection reaches the client as a network error")
    func drop() async throws {
        let (server, base) = try Self.makeServer()
        await #expect(throws: (any Error).self) { _ = try await Self.fetch(base.appendingPathComponent("drop")) }
        await server.shutdown()
    }

    @Test("Shutdown waits for requests in flight, then refuses new connections")
    func gracefulShutdown() async throws {
        let (server, base) = try Self.makeServer()
        async let slow = Self.fetch(base.appendingPathComponent("slow"))
        // Shut down only once the request is being answered (a sleep races the client on a busy machine).
        for _ in 0..<500 where server.requestsInFlight == 0 { try await Task.sleep(for: .milliseconds(10)) }
        #expect(server.requestsInFlight == 1)
        await server.shutdown()
        let (status, data) = try await slow
        #expect(status == 200)
        #expect(String(decoding: data, as: UTF8.self) == "slow")
        await #expect(throws: (any Error).self) { _ = try await Self.fetch(base.appendingPathComponent("fast")) }
    }
}

/// Answers `/prompt` on the transport's thread (echoing the body) and everything else as a task; its task path
/// answers `/prompt` differently, so a client sees which path answered.
struct PromptResponder: Responder {
    func respond(to request: Request) async -> Response {
        .text(request.path == "/prompt" ? "task" : "later \(request.path)")
    }

    func respondPromptly(to request: Request) -> PromptAnswer {
        // `/held/<ms>` is answered after that delay, decided then; `/held-task/<ms>` hands over to a task then;
        // `/held-twice/<ms>` holds again for as long.
        let parts = request.path.split(separator: "/")
        if parts.count == 2, let milliseconds = Int(parts[1]) {
            switch parts[0] {
            case "held": return .after(.milliseconds(milliseconds)) { .now(.text("after \(milliseconds)")) }
            case "held-task": return .after(.milliseconds(milliseconds)) { .later { .text("task after \(milliseconds)") } }
            case "held-twice":
                return .after(.milliseconds(milliseconds)) { .after(.milliseconds(milliseconds)) { .now(.text("twice after \(milliseconds)")) } }
            default: break
            }
        }
        guard request.path == "/prompt" else { return .later { await respond(to: request) } }
        return .now(Response(status: .created, headers: ["Content-Type": "application/octet-stream"], body: request.body))
    }
}

@Suite("libmicrohttpd server, answers on its own thread", .serialized)
struct HTTPServerPromptTests {
    @Test("A prompt answer is sent as given, without a task; other requests on the same connections go on as tasks")
    func promptAnswers() async throws {
        let server = HTTPServer(configuration: .init(port: 0, maxBodySize: 1 << 20, accessLog: false), responder: PromptResponder())
        let base = URL(string: "http://127.0.0.1:\(try server.start())")!
        for round in 0..<50 {
            let payload = Data((0..<(round * 97)).map { UInt8(($0 + round) % 251) })
            let (status, data) = try await HTTPServerTests.fetch(base.appendingPathComponent("prompt"), method: "POST", body: payload)
            #expect(status == 201)
            #expect(data == payload)
            let (laterStatus, later) = try await HTTPServerTests.fetch(base.appendingPathComponent("other"))
            #expect(laterStatus == 200)
            #expect(String(decoding: later, as: UTF8.self) == "later /other")
        }
        #expect(server.requestsInFlight == 0)
        await server.shutdown()
    }

    @Test("An answer held for a delay is sent after it, counted in flight meanwhile; shutdown sends it at once", .timeLimit(.minutes(1)))
    func heldAnswers() async throws {
        let server = HTTPServer(configuration: .init(port: 0, maxBodySize: 1 << 20, accessLog: false), responder: PromptResponder())
        let base = URL(string: "http://127.0.0.1:\(try server.start())")!
        let started = ContinuousClock.now
        let answers = try await withThrowingTaskGroup(of: (String, Int, String, Duration).self) { group in
            for index in 0..<20 {
                let path = ["held", "held-task", "held-twice"][index % 3] + "/\(300 + index * 10)"
                group.addTask {
                    let (status, data) = try await HTTPServerTests.fetch(base.appendingPathComponent(path))
                    return (path, status, String(decoding: data, as: UTF8.self), ContinuousClock.now - started)
                }
            }
            // Held, not answered: counted as requests in flight (the client sends a few at a time).
            for _ in 0..<500 where server.requestsInFlight == 0 { try await Task.sleep(for: .milliseconds(5)) }
            #expect(server.requestsInFlight > 0)
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(answers.count == 20)
        for (path, status, body, elapsed) in answers {
            let milliseconds = Int(path.split(separator: "/")[1])!
            #expect(status == 200)
            let twice = path.hasPrefix("held-twice")
            #expect(body == (path.hasPrefix("held-task") ? "task after \(milliseconds)" : twice ? "twice after \(milliseconds)" : "after \(milliseconds)"))
            #expect(elapsed >= .milliseconds(twice ? 2 * milliseconds : milliseconds))
        }
        #expect(server.requestsInFlight == 0)

        // Shutdown does not wait out an answer held for ten minutes: it is sent, and the server stops.
        async let held = HTTPServerTests.fetch(base.appendingPathComponent("held/600000"))
        async let heldTask = HTTPServerTests.fetch(base.appendingPathComponent("held-task/600000"))
        async let heldTwice = HTTPServerTests.fetch(base.appendingPathComponent("held-twice/600000"))
        for _ in 0..<500 where server.requestsInFlight < 3 { try await Task.sleep(for: .milliseconds(5)) }
        #expect(server.requestsInFlight == 3)
        await server.shutdown(grace: .milliseconds(100))
        #expect(server.stoppedDaemon)  // every held answer's connection taken back: not given up after 10 s
        let (status, data) = try await held
        #expect(status == 200 && String(decoding: data, as: UTF8.self) == "after 600000")
        let (taskStatus, taskData) = try await heldTask
        #expect(taskStatus == 200 && String(decoding: taskData, as: UTF8.self) == "task after 600000")
        let (twiceStatus, twiceData) = try await heldTwice
        #expect(twiceStatus == 200 && String(decoding: twiceData, as: UTF8.self) == "twice after 600000")
    }
}

/// Holds `/held-on-thread` on libmicrohttpd's thread until the test releases it, then hands it to a task that would
/// keep its connection suspended for a second.
final class ThreadHoldingResponder: Responder, Sendable {
    let entered = DispatchSemaphore(value: 0)
    let release = DispatchSemaphore(value: 0)
    private let workStarted = Atomic<Bool>(false)
    var taskRan: Bool { workStarted.load(ordering: .relaxed) }

    func respond(to request: Request) async -> Response { .text("task") }

    func respondPromptly(to request: Request) -> PromptAnswer {
        entered.signal()
        release.wait()
        return .later { [self] in
            workStarted.store(true, ordering: .relaxed)
            try? await Task.sleep(for: .seconds(1))
            return .text("task")
        }
    }
}

@Suite("libmicrohttpd server, stopping", .serialized)
struct HTTPServerStoppingTests {
    @Test("A request that needs a task once shutdown has found no connection suspended is refused, not suspended: libmicrohttpd stops cleanly",
          .timeLimit(.minutes(1)))
    func noSuspensionOnceClosed() async throws {
        let responder = ThreadHoldingResponder()
        let server = HTTPServer(configuration: .init(port: 0, accessLog: false), responder: responder)
        let base = URL(string: "http://127.0.0.1:\(try server.start())")!
        let answer = Task { () -> Int? in try? await HTTPServerTests.fetch(base.appendingPathComponent("held-on-thread")).0 }
        // The request is inside the responder, on libmicrohttpd's thread: not suspended, not a task, so shutdown
        // finds nothing to wait for and closes suspension.
        await Task.detached { responder.entered.wait() }.value
        let stopped = Task { await server.shutdown(grace: .milliseconds(100)) }
        for _ in 0..<2000 where !server.isClosedToSuspension { try await Task.sleep(for: .milliseconds(5)) }
        #expect(server.isClosedToSuspension)
        // Released now, the request would be suspended for its task while libmicrohttpd stops (which aborts the
        // process); it is answered 503 instead, or its connection closes with the daemon.
        responder.release.signal()
        await stopped.value
        let status = await answer.value
        #expect(status == nil || status == 503)
        #expect(!responder.taskRan)
        #expect(server.stoppedDaemon)
    }
}

/// One kept-alive HTTP/1.1 connection to 127.0.0.1, read with a timeout: a test sees each answer's status and
/// headers, and which connection carried it. Used by one caller at a time.
final class RawConnection: @unchecked Sendable {
    private let socket: Int32
    private var buffered: [UInt8] = []

    init(port: UInt16) throws {
        socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard socket >= 0 else { throw HTTPError(.internalServerError, code: "socket", message: "no socket") }
        var timeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(socket, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        guard connected else { throw HTTPError(.internalServerError, code: "connect", message: "cannot connect") }
    }

    deinit { close(socket) }

    typealias Answer = (status: Int, headers: [String: String], body: String)

    /// `get` on a thread of its own: its blocking reads must not hold one of the cooperative pool's few threads, which
    /// the server's own tasks need to answer.
    func fetch(_ path: String) async -> Answer? {
        await withCheckedContinuation { (continuation: CheckedContinuation<Answer?, Never>) in
            Thread { continuation.resume(returning: self.get(path)) }.start()
        }
    }

    /// Sends `GET path` and reads the answer: its status, its headers (names lowercased) and its body; nil when the
    /// connection closed (or nothing came for 10 s) before a whole answer.
    func get(_ path: String) -> Answer? {
        let request = Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8)
        guard send(socket, request, request.count, Int32(MSG_NOSIGNAL)) == request.count else { return nil }
        var chunk = [UInt8](repeating: 0, count: 4096)
        func fill() -> Bool {
            let count = recv(socket, &chunk, chunk.count, 0)
            guard count > 0 else { return false }
            buffered += chunk[0..<count]
            return true
        }
        var headEnd = buffered.firstRange(of: Array("\r\n\r\n".utf8))
        while headEnd == nil {
            guard fill() else { return nil }
            headEnd = buffered.firstRange(of: Array("\r\n\r\n".utf8))
        }
        guard let headEnd else { return nil }
        let lines = String(decoding: buffered[..<headEnd.lowerBound], as: UTF8.self).components(separatedBy: "\r\n")
        let statusLine = lines[0].split(separator: " ")
        let status = statusLine.count > 1 ? Int(statusLine[1]) ?? 0 : 0
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        let length = Int(headers["content-length"] ?? "0") ?? 0
        while buffered.count < headEnd.upperBound + length {
            guard fill() else { return nil }
        }
        let body = String(decoding: buffered[headEnd.upperBound..<(headEnd.upperBound + length)], as: UTF8.self)
        buffered.removeFirst(headEnd.upperBound + length)
        return (status, headers, body)
    }
}

/// `/deaf` waits for the test's release and ignores cancellation; `/quick` is answered by a task at once.
final class DeafResponder: Responder, Sendable {
    private let released = Locked<(open: Bool, waiting: [CheckedContinuation<Void, Never>])>((false, []))

    func release() {
        let waiting = released.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiting = [] }
            return state.waiting
        }
        for waiter in waiting { waiter.resume() }
    }

    func respond(to request: Request) async -> Response {
        guard request.path == "/deaf" else { return .text("quick") }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let open = released.withLock { state -> Bool in
                if !state.open { state.waiting.append(continuation) }
                return state.open
            }
            if open { continuation.resume() }
        }
        return .text("deaf")
    }
}

extension HTTPServerStoppingTests {
    @Test("While shutting down, answers close their kept-alive connections; past the grace a new request is answered 503 at once",
          .timeLimit(.minutes(1)))
    func keptAliveConnectionsDrain() async throws {
        let responder = DeafResponder()
        defer { responder.release() }  // a failed requirement below must not leave the stop waiting on it
        let server = HTTPServer(configuration: .init(port: 0, accessLog: false), responder: responder)
        let port = try server.start()
        let (early, late) = (try RawConnection(port: port), try RawConnection(port: port))
        for connection in [early, late] {
            let answer = try #require(await connection.fetch("/quick"))
            #expect(answer.status == 200 && answer.headers["connection"]?.lowercased() != "close")
        }
        // A request deaf to cancellation keeps the stop in its grace, then in its wait for cancelled work.
        let deafConnection = try RawConnection(port: port)
        let deaf = Task { await deafConnection.fetch("/deaf") }
        for _ in 0..<2000 where server.requestsInFlight == 0 { try await Task.sleep(for: .milliseconds(5)) }
        try #require(server.requestsInFlight == 1)
        let stopped = Task { await server.shutdown(grace: .seconds(3)) }
        for _ in 0..<2000 where !server.isDraining { try await Task.sleep(for: .milliseconds(5)) }
        #expect(!server.isStopping)
        let inGrace = try #require(await early.fetch("/quick"))
        #expect(inGrace.status == 200 && inGrace.body == "quick")
        #expect(inGrace.headers["connection"]?.lowercased() == "close")
        for _ in 0..<2000 where !server.isStopping { try await Task.sleep(for: .milliseconds(5)) }
        let pastGrace = try #require(await late.fetch("/quick"))
        #expect(pastGrace.status == 503 && pastGrace.body.contains("shutting_down"))
        #expect(pastGrace.headers["connection"]?.lowercased() == "close")
        responder.release()
        await stopped.value
        _ = await deaf.value
        #expect(server.stoppedDaemon)  // not given up with a connection still counted as suspended
    }
}
