import CSystem
import Clocks
import Foundation
import Locking
#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// Which connections may serve a request.
struct PoolKey: Hashable {
    let host: String
    let port: Int
    let secure: Bool
}

/// A request waiting for, or travelling on, a connection.
final class PendingRequest: @unchecked Sendable {  // handed to the loop thread, then used only there
    let id: UInt64
    let key: PoolKey
    let address: SocketAddress
    /// The request on the wire; emptied once it has been sent for `keptAfterSending` without an answer.
    private(set) var bytes: [UInt8]
    let deadline: UInt64
    private var continuation: CheckedContinuation<HTTPClientResponse, any Error>?
    /// A request that failed on a reused connection before any answer is tried once more on a new one.
    var retried = false
    /// When the last byte went out (monotonic nanoseconds; 0 while sending).
    var sentAt: UInt64 = 0
    /// Whether `bytes` were let go: the request can no longer be sent again.
    private(set) var released = false
    /// The request's fields for HTTP/2 (pseudo-headers first); its body is `bytes` from `bodyStart`.
    let http2Fields: [(String, String)]?
    let bodyStart: Int
    /// Whether the whole answer arrived on an HTTP/2 stream (a reset after it does not fail the call).
    var isAnswered = false

    /// How long a sent request's bytes are kept for one more try. A kept-alive connection the server had already
    /// closed fails within a round trip of the send; later, the server had the request and the caller's own
    /// retry decides. Thousands of calls wait seconds on Apple, and each would otherwise keep its receipt twice.
    static let keptAfterSending: UInt64 = 1_000_000_000

    init(id: UInt64, key: PoolKey, address: SocketAddress, bytes: [UInt8], deadline: UInt64,
         continuation: CheckedContinuation<HTTPClientResponse, any Error>, http2Fields: [(String, String)]? = nil, bodyStart: Int = 0) {
        self.id = id
        self.key = key
        self.address = address
        self.bytes = bytes
        self.http2Fields = http2Fields
        self.bodyStart = bodyStart
        self.deadline = deadline
        self.continuation = continuation
    }

    var isFinished: Bool { continuation == nil }

    /// Lets the bytes go once they have been sent for `keptAfterSending`.
    func release(now: UInt64) {
        guard !released, sentAt != 0, now &- sentAt >= Self.keptAfterSending else { return }
        bytes = []
        released = true
    }

    func finish(_ result: Result<HTTPClientResponse, HTTPClientError>) {
        guard let continuation else { return }
        self.continuation = nil
        continuation.resume(with: result.mapError { $0 as any Error })
    }
}

/// One socket and where it stands.
final class Connection {
    /// `multiplexing`: an HTTP/2 connection past its connect (and handshake), carrying many requests at once.
    enum Phase { case connecting, handshaking, writing, reading, idle, multiplexing }

    let fd: Int32
    let key: PoolKey
    let tls: TLSSession?
    var phase = Phase.connecting
    var request: PendingRequest?
    var written = 0
    var parser = ResponseParser()
    var reused = false
    var idleSince: UInt64 = 0
    /// The HTTP/2 session of a multiplexed connection (nil for HTTP/1.1).
    let http2: HTTP2ClientSession?

    init(fd: Int32, key: PoolKey, tls: TLSSession?, http2: HTTP2ClientSession? = nil) {
        self.fd = fd
        self.key = key
        self.tls = tls
        self.http2 = http2
    }

    func read(into buffer: UnsafeMutableRawBufferPointer) -> IOStep {
        if let tls { return tls.read(into: buffer) }
        let count = recv(fd, buffer.baseAddress, buffer.count, 0)
        if count > 0 { return .done(count) }
        if count == 0 { return .closed }
        return Self.classify(errno, during: "read")
    }

    func write(_ bytes: UnsafeRawBufferPointer) -> IOStep {
        if let tls { return tls.write(bytes) }
        let count = send(fd, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL))
        return count >= 0 ? .done(count) : Self.classify(errno, during: "write")
    }

    static func classify(_ code: Int32, during action: String) -> IOStep {
        switch code {
        case EAGAIN, EWOULDBLOCK, EINTR: return .wouldBlock
        case ECONNRESET, EPIPE: return .closed
        default: return .failed(HTTPClientError(.connectionClosed, "\(action): \(String(cString: strerror(code)))"))
        }
    }
}

/// Connections to one host.
final class Pool {
    /// Whether the host speaks HTTP/2 over cleartext: unknown until its first connection's SETTINGS arrive (or the
    /// connection fails without them, and the host is served over HTTP/1.1 from then on).
    enum Speaks { case unknown, http2, http1 }

    var idle: [Connection] = []
    var open = 0
    var protocolChoice = Speaks.unknown
    /// HTTP/2 connections open, each carrying up to its server's limit of streams.
    var multiplexed: [Connection] = []
    var waiting: [PendingRequest] = []
    var waitingHead = 0

    /// The oldest waiting request still due an answer; those past their deadline on the way are ended as timed out
    /// (a connection freed in the sweep that finds them due must not carry them to the server).
    func nextWaiting(now: UInt64) -> PendingRequest? {
        while waitingHead < waiting.count {
            let request = waiting[waitingHead]
            waitingHead += 1
            if waitingHead > 1024 && waitingHead * 2 > waiting.count {
                waiting.removeFirst(waitingHead)
                waitingHead = 0
            }
            guard !request.isFinished else { continue }
            guard request.deadline > now else {
                request.finish(.failure(HTTPClientError(.timedOut, "timed out waiting for a connection to \(request.key.host)")))
                continue
            }
            return request
        }
        return nil
    }
}

/// The thread that owns every socket: epoll, edge-triggered, each connection driven until it would block.
/// Other threads talk to it only through `submit` and `cancel` (a locked inbox and an eventfd).
final class EventLoop: @unchecked Sendable {
    private enum Command {
        case start(PendingRequest)
        case cancel(UInt64)
    }

    private let configuration: HTTPClient.Configuration
    private let tls: TLSContext
    private let epoll: Int32
    private let wakeFD: Int32
    private let inbox = Locked<(commands: [Command], stopping: Bool)>(([], false))
    private let ids = Atomic<UInt64>(0)

    // Owned by the loop thread.
    private var connections: [Int32: Connection] = [:] {
        didSet { openConnections.store(connections.count, ordering: .relaxed) }
    }
    /// Sockets the loop holds open (in use or idle), readable from any thread.
    let openConnections = Atomic<Int>(0)
    /// Connections the loop has opened since it started, readable from any thread.
    let connectionsOpened = Atomic<Int>(0)
    private var byRequest: [UInt64: Connection] = [:] {
        didSet { requestsOnConnections.store(byRequest.count, ordering: .relaxed) }
    }
    /// Requests assigned to a connection (`byRequest`), readable from any thread.
    let requestsOnConnections = Atomic<Int>(0)
    /// Requests on HTTP/2 streams, readable from any thread.
    let requestsOnHTTP2 = Atomic<Int>(0)
    private var streamsOpen = 0 {
        didSet { requestsOnHTTP2.store(streamsOpen, ordering: .relaxed) }
    }
    private var pools: [PoolKey: Pool] = [:]
    /// Every submitted request's deadline; entries of requests that ended stay until due (or a compaction).
    private var deadlines = DeadlineHeap()
    /// Requests by when their last byte went out, for letting their bytes go `PendingRequest.keptAfterSending` later.
    private var sent = MomentQueue()
    private var lastSweep: UInt64 = 0
    private var tearingDown = false
    private let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 64 << 10, alignment: 16)

    init(configuration: HTTPClient.Configuration, tls: TLSContext) throws(HTTPClientError) {
        self.configuration = configuration
        self.tls = tls
        signal(SIGPIPE, SIG_IGN)  // OpenSSL writes with write(2); a peer that went away must not end the process
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakeFD = eventfd(0, Int32(EFD_NONBLOCK) | Int32(EFD_CLOEXEC))
        guard epoll >= 0, wakeFD >= 0 else { throw HTTPClientError(.connectFailed, "epoll/eventfd: \(String(cString: strerror(errno)))") }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.fd = wakeFD
        epoll_ctl(epoll, EPOLL_CTL_ADD, wakeFD, &event)
        let thread = Thread { [self] in run() }
        thread.name = "storekeeper-http-client"
        thread.start()
    }

    func nextID() -> UInt64 { ids.add(1, ordering: .relaxed).newValue }

    func submit(_ request: PendingRequest) { send(.start(request), failing: request) }

    func cancel(_ id: UInt64) { send(.cancel(id), failing: nil) }

    func shutdown() {
        let first = inbox.withLock { state -> Bool in
            defer { state.stopping = true }
            return !state.stopping
        }
        if first { wake() }
    }

    private func send(_ command: Command, failing request: PendingRequest?) {
        let outcome = inbox.withLock { state -> (accepted: Bool, wake: Bool) in
            guard !state.stopping else { return (false, false) }
            state.commands.append(command)
            return (true, state.commands.count == 1)
        }
        if !outcome.accepted { request?.finish(.failure(HTTPClientError(.shutDown, "the HTTP client was shut down"))) }
        if outcome.wake { wake() }
    }

    private func wake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    // MARK: The loop

    private func run() {
        var events = [epoll_event](repeating: epoll_event(), count: 512)
        while true {
            let timeout: Int32 = connections.isEmpty ? 1000 : 50
            let count = epoll_wait(epoll, &events, Int32(events.count), timeout)
            if count > 0 {
                for index in 0..<Int(count) {
                    let fd = events[index].data.fd
                    if fd == wakeFD {
                        var value: UInt64 = 0
                        _ = read(wakeFD, &value, 8)
                    } else if let connection = connections[fd] {
                        drive(connection)
                    }
                }
            }
            let (commands, stopping) = inbox.withLock { state in
                defer { state.commands.removeAll(keepingCapacity: true) }
                return (state.commands, state.stopping)
            }
            if stopping {
                tearDown(commands)
                return
            }
            for command in commands {
                switch command {
                case .start(let request):
                    deadlines.push(deadline: request.deadline, id: request.id)
                    start(request)
                case .cancel(let id): cancelRequest(id)
                }
            }
            let now = Monotonic.now
            if now &- lastSweep >= 50_000_000 {
                lastSweep = now
                sweep(now: now)
            }
        }
    }

    private func start(_ request: PendingRequest) {
        guard !request.isFinished else { return }
        guard Monotonic.now < request.deadline else {
            request.finish(.failure(HTTPClientError(.timedOut, "timed out waiting for a connection to \(request.key.host)")))
            return
        }
        let pool = pool(for: request.key)
        if usesHTTP2(request.key, pool) {
            if let connection = pool.multiplexed.first(where: { $0.http2!.hasRoom }) {
                submit(request, on: connection)
            } else if pool.open < configuration.maxConnectionsPerHost && (pool.protocolChoice == .http2 || pool.multiplexed.isEmpty) {
                open(for: request, in: pool)
            } else {
                // Until the first connection's SETTINGS tell whether the host speaks HTTP/2, requests past its first streams wait.
                pool.waiting.append(request)
            }
            return
        }
        if let connection = pool.idle.popLast() {
            connection.reused = true
            assign(request, to: connection)
            drive(connection)
        } else if pool.open < configuration.maxConnectionsPerHost {
            open(for: request, in: pool)
        } else {
            pool.waiting.append(request)
        }
    }

    private func pool(for key: PoolKey) -> Pool {
        if let pool = pools[key] { return pool }
        let pool = Pool()
        pools[key] = pool
        return pool
    }

    /// Whether requests to `key` go over HTTP/2: cleartext hosts with prior knowledge (RFC 9113 §3.3), unless the host
    /// turned out not to speak it.
    private func usesHTTP2(_ key: PoolKey, _ pool: Pool) -> Bool {
        configuration.http2PriorKnowledge && !key.secure && pool.protocolChoice != .http1
    }

    private func open(for request: PendingRequest, in pool: Pool) {
        let fd = socket(request.address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else {
            request.finish(.failure(HTTPClientError(.connectFailed, "socket: \(String(cString: strerror(errno)))")))
            return
        }
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        let result = request.address.withSockaddr { connect(fd, $0, $1) }
        guard result == 0 || errno == EINPROGRESS else {
            let reason = String(cString: strerror(errno))
            Glibc.close(fd)
            request.finish(.failure(HTTPClientError(.connectFailed, "connect to \(request.key.host):\(request.key.port): \(reason)")))
            return
        }
        var session: TLSSession?
        if request.key.secure {
            do {
                session = try tls.session(fd: fd, host: request.key.host)
            } catch {
                Glibc.close(fd)
                request.finish(.failure(error))
                return
            }
        }
        var http2: HTTP2ClientSession?
        if usesHTTP2(request.key, pool) {
            http2 = HTTP2ClientSession(maxResponseBytes: configuration.maxResponseBytes)
            if http2 == nil {
                Glibc.close(fd)
                request.finish(.failure(HTTPClientError(.connectFailed, "cannot make an HTTP/2 session")))
                return
            }
        }
        let connection = Connection(fd: fd, key: request.key, tls: session, http2: http2)
        var event = epoll_event()
        event.events = EPOLLIN.rawValue | EPOLLOUT.rawValue | EPOLLRDHUP.rawValue | EPOLLET.rawValue
        event.data.fd = fd
        epoll_ctl(epoll, EPOLL_CTL_ADD, fd, &event)
        connections[fd] = connection
        connectionsOpened.add(1, ordering: .relaxed)
        pool.open += 1
        if http2 != nil {
            pool.multiplexed.append(connection)
            submit(request, on: connection)
            return
        }
        assign(request, to: connection)
        drive(connection)
    }

    // MARK: HTTP/2

    /// Opens a stream for `request` on a multiplexed connection and sends what can be sent.
    private func submit(_ request: PendingRequest, on connection: Connection) {
        guard let session = connection.http2, session.submit(request) else {
            request.finish(.failure(HTTPClientError(.connectionClosed, "the HTTP/2 connection to \(request.key.host) is going away")))
            return
        }
        byRequest[request.id] = connection
        streamsOpen += 1
        if connection.phase == .multiplexing { driveHTTP2(connection) }
    }

    /// Reads what arrived, writes what is due, finishes the calls that ended and gives freed streams to waiting requests.
    private func driveHTTP2(_ connection: Connection) {
        guard let session = connection.http2, connections[connection.fd] === connection else { return }
        reading: while true {
            switch connection.read(into: readBuffer) {
            case .done(let count):
                if let error = session.receive(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count])) {
                    failHTTP2(connection, error)
                    return
                }
            case .wouldBlock: break reading
            case .closed:
                failHTTP2(connection, HTTPClientError(.connectionClosed, "connection closed by \(connection.key.host)"))
                return
            case .failed(let error):
                failHTTP2(connection, error)
                return
            }
        }
        let pool = pool(for: connection.key)
        if session.confirmed && pool.protocolChoice != .http2 { pool.protocolChoice = .http2 }
        if let error = session.send({ connection.write($0) }) {
            failHTTP2(connection, error)
            return
        }
        for request in session.takeJustSent() { sent.append(moment: request.sentAt, id: request.id) }
        finishEnded(connection)
        pumpHTTP2(pool)
        if session.active == 0 && connection.idleSince == 0 { connection.idleSince = Monotonic.now }
        if !session.isWanted { failHTTP2(connection, HTTPClientError(.connectionClosed, "\(connection.key.host) ended the HTTP/2 connection")) }
    }

    private func finishEnded(_ connection: Connection) {
        guard let session = connection.http2 else { return }
        for (call, result) in session.takeEnded() {
            byRequest[call.request.id] = nil
            streamsOpen -= 1
            call.request.finish(result)
        }
        // Refused unprocessed: sent once more, elsewhere (this connection is going away or full).
        for request in session.takeRefused() {
            byRequest[request.id] = nil
            streamsOpen -= 1
            sendAgain(request, or: HTTPClientError(.connectionClosed, "\(request.key.host) refused the stream"))
        }
        if session.active > 0 { connection.idleSince = 0 }
    }

    /// Starts a request once more if it may be (never sent again before, its bytes still held), or fails it.
    private func sendAgain(_ request: PendingRequest, or error: HTTPClientError) {
        if !request.retried && !request.released && !tearingDown {
            request.retried = true
            start(request)
        } else {
            request.finish(.failure(error))
        }
    }

    /// Gives waiting requests to connections with a stream free, opening more while the host allows.
    private func pumpHTTP2(_ pool: Pool) {
        while pool.waitingHead < pool.waiting.count {
            if let connection = pool.multiplexed.first(where: { $0.http2!.hasRoom }) {
                guard let next = pool.nextWaiting(now: Monotonic.now) else { return }
                submit(next, on: connection)
            } else if pool.protocolChoice == .http2 && pool.open < configuration.maxConnectionsPerHost {
                guard let next = pool.nextWaiting(now: Monotonic.now) else { return }
                open(for: next, in: pool)
            } else {
                return
            }
        }
    }

    /// Ends a multiplexed connection. Its calls fail with `error`, except:
    /// - the host answered the preface as HTTP/1: it is served over HTTP/1.1 from now on, and the calls are sent again that
    ///   way (a server that does not speak HTTP/2 never read them as requests);
    /// - nothing at all arrived (an HTTP/2 server's first frame is its SETTINGS, so none was read): sent again once, as
    ///   HTTP/1.1 does for a reused connection that fails before any byte.
    private func failHTTP2(_ connection: Connection, _ error: HTTPClientError) {
        guard let session = connection.http2, connections.removeValue(forKey: connection.fd) != nil else { return }
        if !session.receivedAny && connection.phase == .multiplexing {
            // Failed while sending, perhaps with the server's answer to the preface already here: read it before closing.
            if case .done(let count) = connection.read(into: readBuffer) { session.noteLast(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count])) }
        }
        Glibc.close(connection.fd)
        let pool = pool(for: connection.key)
        pool.open -= 1
        pool.multiplexed.removeAll { $0 === connection }
        finishEnded(connection)
        let requests = session.takeAll()
        let fallBack = session.answeredAsHTTP1 && !session.confirmed && pool.protocolChoice != .http2
        if fallBack { pool.protocolChoice = .http1 }
        let unread = fallBack || (connection.phase == .multiplexing && !session.receivedAny)
        streamsOpen -= requests.count
        for request in requests {
            byRequest[request.id] = nil
            if unread {
                sendAgain(request, or: error)
            } else {
                request.finish(.failure(error))
            }
        }
        if tearingDown { return }
        if pool.protocolChoice == .http1 {
            while pool.open < configuration.maxConnectionsPerHost, let next = pool.nextWaiting(now: Monotonic.now) { start(next) }
        } else {
            pumpHTTP2(pool)
            // Nothing open and requests waiting: a new connection for the first of them.
            if pool.multiplexed.isEmpty, pool.open < configuration.maxConnectionsPerHost, let next = pool.nextWaiting(now: Monotonic.now) {
                open(for: next, in: pool)
            }
        }
    }

    /// Resets one call's stream (deadline or cancellation) and finishes it; true if it was on an HTTP/2 connection.
    private func resetHTTP2(_ id: UInt64, in connection: Connection, with error: HTTPClientError) -> Bool {
        guard let session = connection.http2 else { return false }
        byRequest[id] = nil
        if let request = session.reset(id) {
            streamsOpen -= 1
            request.finish(.failure(error))
            driveHTTP2(connection)
        }
        return true
    }

    private func assign(_ request: PendingRequest, to connection: Connection) {
        connection.request = request
        connection.written = 0
        request.sentAt = 0
        connection.parser = ResponseParser(maxBodyBytes: configuration.maxResponseBytes)
        if connection.phase == .idle { connection.phase = .writing }
        byRequest[request.id] = connection
    }

    /// Moves `connection` forward until it would block.
    private func drive(_ connection: Connection) {
        while true {
            switch connection.phase {
            case .connecting:
                var code: Int32 = 0
                var length = socklen_t(MemoryLayout<Int32>.size)
                getsockopt(connection.fd, SOL_SOCKET, SO_ERROR, &code, &length)
                if code != 0 {
                    fail(connection, HTTPClientError(.connectFailed, "connect to \(connection.key.host):\(connection.key.port): \(String(cString: strerror(code)))"))
                    return
                }
                var peer = sockaddr_storage()
                var peerLength = socklen_t(MemoryLayout<sockaddr_storage>.size)
                let connected = withUnsafeMutablePointer(to: &peer) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getpeername(connection.fd, $0, &peerLength) == 0 }
                }
                guard connected else { return }
                connection.phase = connection.tls != nil ? .handshaking : connection.http2 != nil ? .multiplexing : .writing
            case .handshaking:
                switch connection.tls!.handshake() {
                case .done: connection.phase = connection.http2 != nil ? .multiplexing : .writing
                case .wouldBlock: return
                case .closed: fail(connection, HTTPClientError(.tlsFailed, "connection closed during the TLS handshake")); return
                case .failed(let error): fail(connection, error); return
                }
            case .writing:
                guard let request = connection.request else { connection.phase = .idle; return }
                let step = request.bytes.withUnsafeBytes { bytes in
                    connection.write(UnsafeRawBufferPointer(rebasing: bytes[connection.written...]))
                }
                switch step {
                case .done(let count):
                    connection.written += count
                    if connection.written == request.bytes.count {
                        connection.phase = .reading
                        request.sentAt = Monotonic.now
                        sent.append(moment: request.sentAt, id: request.id)
                    }
                case .wouldBlock: return
                case .closed: fail(connection, HTTPClientError(.connectionClosed, "connection closed while sending")); return
                case .failed(let error): fail(connection, error); return
                }
            case .reading:
                switch connection.read(into: readBuffer) {
                case .done(let count):
                    do {
                        if try connection.parser.feed(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count])) {
                            complete(connection)
                            if connection.phase != .writing { return }
                        }
                    } catch {
                        fail(connection, error)
                        return
                    }
                case .wouldBlock: return
                case .closed:
                    if connection.parser.finishAtEndOfStream() {
                        complete(connection)
                        close(connection)
                    } else {
                        fail(connection, HTTPClientError(.connectionClosed, "connection closed before the response was complete"))
                    }
                    return
                case .failed(let error): fail(connection, error); return
                }
            case .multiplexing:
                driveHTTP2(connection)
                return
            case .idle:
                // Anything but "nothing to read" on an idle connection (the server closed it, stray bytes) ends it.
                switch connection.read(into: readBuffer) {
                case .wouldBlock: return
                default: close(connection); return
                }
            }
        }
    }

    private func complete(_ connection: Connection) {
        guard let request = connection.request else { return }
        let parser = connection.parser
        connection.request = nil
        byRequest[request.id] = nil
        request.finish(.success(HTTPClientResponse(status: parser.status, headers: parser.headers, body: parser.body)))
        guard parser.keepAlive else {
            close(connection)
            return
        }
        let pool = pool(for: connection.key)
        connection.reused = true
        if let next = pool.nextWaiting(now: Monotonic.now) {
            assign(next, to: connection)
            connection.phase = .writing
        } else if let openAtMost = configuration.openAtMost, connections.count > openAtMost() + configuration.openSlack {
            close(connection)
        } else {
            connection.phase = .idle
            connection.idleSince = Monotonic.now
            pool.idle.append(connection)
        }
    }

    /// Ends `connection` with `error`; a request that never got an answer on a reused connection gets one more try.
    private func fail(_ connection: Connection, _ error: HTTPClientError) {
        if connection.http2 != nil {
            failHTTP2(connection, error)
            return
        }
        let request = connection.request
        let retry = connection.reused && !connection.parser.sawBytes && request?.retried == false && request?.released == false
        // Closed with its request still on it, so that `close` forgets the request's id too.
        close(connection)
        connection.request = nil
        guard let request else { return }
        if retry {
            request.retried = true
            start(request)
        } else {
            request.finish(.failure(error))
        }
    }

    /// Closes the socket and forgets the connection (and its request's id); `listedIdle` is false when the caller already
    /// took it off its pool's idle list.
    private func close(_ connection: Connection, listedIdle: Bool = true) {
        guard connections.removeValue(forKey: connection.fd) != nil else { return }
        if let request = connection.request { byRequest[request.id] = nil }
        Glibc.close(connection.fd)
        let pool = pool(for: connection.key)
        pool.open -= 1
        if listedIdle, connection.phase == .idle, let index = pool.idle.firstIndex(where: { $0 === connection }) { pool.idle.remove(at: index) }
        if !tearingDown, pool.open < configuration.maxConnectionsPerHost, let next = pool.nextWaiting(now: Monotonic.now) { open(for: next, in: pool) }
    }

    private func cancelRequest(_ id: UInt64) {
        if let connection = byRequest[id], resetHTTP2(id, in: connection, with: HTTPClientError(.cancelled, "cancelled")) { return }
        if let connection = byRequest.removeValue(forKey: id), let request = connection.request {
            connection.request = nil
            close(connection)
            request.finish(.failure(HTTPClientError(.cancelled, "cancelled")))
            return
        }
        for pool in pools.values {
            for request in pool.waiting[pool.waitingHead...] where request.id == id {
                request.finish(.failure(HTTPClientError(.cancelled, "cancelled")))
            }
        }
    }

    /// Every 50 ms: ends calls past their deadline, closes idle connections past their time, and lets sent bytes go.
    /// Each of the three is kept in the order it falls due (a heap of deadlines, the idle lists oldest first, the sent
    /// requests in the order they went out), so a sweep visits what ends, not the thousands of calls held on Apple.
    private func sweep(now: UInt64) {
        // Waiting requests first: a connection closed below takes the next waiting one, which must still be due.
        var waiting = 0
        for pool in pools.values {
            for request in pool.waiting[pool.waitingHead...] where !request.isFinished {
                if request.deadline <= now {
                    request.finish(.failure(HTTPClientError(.timedOut, "timed out waiting for a connection to \(request.key.host)")))
                } else {
                    waiting += 1
                }
            }
        }
        while let id = deadlines.popDue(now: now) {
            if let connection = byRequest[id], resetHTTP2(id, in: connection, with: HTTPClientError(.timedOut, "no answer from \(connection.key.host) in time")) {
                continue
            }
            guard let connection = byRequest[id], let request = connection.request, request.id == id else { continue }
            // Closed with its request still on it, so that `close` forgets the request's id too.
            close(connection)
            connection.request = nil
            request.finish(.failure(HTTPClientError(.timedOut, "no answer from \(connection.key.host) in time")))
        }
        let idleLimit = UInt64(configuration.idleTimeout * 1e9)
        // Past `openAtMost` and its slack, idle connections close (each pool's oldest first), however long they were idle.
        var surplus = configuration.openAtMost.map { connections.count - $0() - configuration.openSlack } ?? 0
        for pool in pools.values {
            var expired = pool.idle.prefix { now &- $0.idleSince > idleLimit }.count
            if surplus > expired { expired = min(pool.idle.count, surplus) }
            if expired > 0 {
                surplus -= expired
                let ending = Array(pool.idle[..<expired])
                pool.idle.removeFirst(expired)
                for connection in ending { close(connection, listedIdle: false) }
            }
            for connection in pool.multiplexed where connection.http2!.active == 0 && connection.idleSince != 0 && now &- connection.idleSince > idleLimit {
                failHTTP2(connection, HTTPClientError(.connectionClosed, "idle"))
            }
        }
        if now >= PendingRequest.keptAfterSending {
            while let id = sent.popFirst(atOrBefore: now - PendingRequest.keptAfterSending) {
                if let connection = byRequest[id], let session = connection.http2 {
                    // Sent on a connection that showed it speaks HTTP/2: never sent again, so its bytes may go.
                    if session.confirmed { session.request(id)?.release(now: now) }
                    continue
                }
                guard let connection = byRequest[id], connection.phase == .reading, let request = connection.request, request.id == id else { continue }
                request.release(now: now)
            }
        }
        // Entries of requests that ended early: dropped once they are most of the heap, so long timeouts cannot grow it.
        if deadlines.count > 2 * (byRequest.count + waiting) + 1024 {
            var live = Set(byRequest.keys)
            for pool in pools.values {
                for request in pool.waiting[pool.waitingHead...] where !request.isFinished { live.insert(request.id) }
            }
            deadlines.removeAll { live.contains($0) }
        }
    }

    private func tearDown(_ commands: [Command]) {
        tearingDown = true
        let error = HTTPClientError(.shutDown, "the HTTP client was shut down")
        for command in commands { if case .start(let request) = command { request.finish(.failure(error)) } }
        for connection in Array(connections.values) {
            if connection.http2 != nil {
                failHTTP2(connection, error)
                continue
            }
            let request = connection.request
            connection.request = nil
            close(connection)
            request?.finish(.failure(error))
        }
        for pool in pools.values { for request in pool.waiting[pool.waitingHead...] { request.finish(.failure(error)) } }
        pools = [:]
        Glibc.close(epoll)
        Glibc.close(wakeFD)
        readBuffer.deallocate()
    }
}
