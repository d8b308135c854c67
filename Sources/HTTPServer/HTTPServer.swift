import CMicroHTTPD
import Clocks
import Foundation
import HTTP
import Locking
import Synchronization

/// Serves a `Responder` over HTTP/1.1 with libmicrohttpd.
///
/// libmicrohttpd owns the sockets and its own polling threads. Each request's body is collected on
/// those threads; the connection is then suspended while the Swift responder runs as a task on the
/// cooperative pool, and resumed when the response is ready, so slow handlers never block
/// libmicrohttpd's threads.
public final class HTTPServer: Sendable {
    /// TLS tunnels (`CONNECT` to an intercepted host) open at once; each holds two descriptors besides its
    /// connection: the client's socket and the front's end of a socket pair.
    public static let tunnelLimit = 256

    /// How the server listens and limits requests.
    public struct Configuration: Sendable {
        /// IPv4 address to bind, `127.0.0.1` by default.
        public var host: String
        /// Port to bind; 0 picks a free port.
        public var port: UInt16
        /// Largest accepted body in bytes; larger bodies get 413.
        public var maxBodySize: Int
        /// Seconds of inactivity after which a connection is closed.
        public var connectionTimeout: UInt32
        /// Most simultaneous connections.
        public var connectionLimit: UInt32
        /// Polling threads of libmicrohttpd.
        public var threads: UInt32
        /// Whether to write one access log line per request to standard error.
        public var accessLog: Bool
        /// Most simultaneous connections from one IP address (0: no limit). Loopback peers (the
        /// purchase server calling the emulator, benchmarks) are one address, so it is off by default.
        public var connectionsPerIP: UInt32 = 0
        /// Where the server counts its open connections: shared, so that what is sized by them (a purchase server's calls
        /// to Apple) can be made before the server.
        public var openConnections = ConnectionCount()
        /// Seconds a request may take from its headers to its last body byte; slower uploads are cut.
        public var requestDeadline: Double = 60
        /// `text` (one readable line) or `json` (one object per line, for log pipelines).
        public var logFormat: LogFormat = .text

        /// When set, the port also terminates TLS and answers `CONNECT` for these host names (see `Interception`).
        public var interception: Interception?

        /// How access log lines are written.
        public enum LogFormat: String, Sendable {
            case text, json
        }

        /// Serving other hosts' names over TLS on the same port: a client that sends `CONNECT host:443` for one
        /// of `hosts` gets a tunnel whose TLS ends here (`HTTPS_PROXY`), a client that starts TLS at once is
        /// served too (a hosts entry), and every other `CONNECT` is refused. The plaintext inside goes to the
        /// same responder, which tells the hosts apart by `Host`.
        public struct Interception: Sendable {
            /// Names accepted in `CONNECT` and SNI (lowercased; port 443 only).
            public var hosts: Set<String>
            /// The server certificate (with `hosts` among its names) then its intermediates, PEM.
            public var certificateChainPEM: String
            /// The server certificate's private key, PEM.
            public var privateKeyPEM: String
            /// More ports that accept the same connections (443 for a hosts entry, say).
            public var extraPorts: [UInt16]

            public init(hosts: Set<String>, certificateChainPEM: String, privateKeyPEM: String, extraPorts: [UInt16] = []) {
                self.hosts = hosts
                self.certificateChainPEM = certificateChainPEM
                self.privateKeyPEM = privateKeyPEM
                self.extraPorts = extraPorts
            }
        }

        /// Creates a configuration with loopback-only defaults.
        public init(host: String = "127.0.0.1", port: UInt16 = 0, maxBodySize: Int = 4 << 20,
                    connectionTimeout: UInt32 = 30, connectionLimit: UInt32 = 1024, threads: UInt32 = 2,
                    accessLog: Bool = true) {
            self.host = host
            self.port = port
            self.maxBodySize = maxBodySize
            self.connectionTimeout = connectionTimeout
            self.connectionLimit = connectionLimit
            self.threads = threads
            self.accessLog = accessLog
        }
    }

    /// A failure to start listening.
    public struct StartError: Error, CustomStringConvertible {
        public let description: String
    }

    let configuration: Configuration
    let responder: any Responder
    /// Bodies up to this size are read and discarded before a refusal is sent; larger ones are answered at once.
    static let drainLimit = 16 << 20
    private let state = Locked<State>(State())
    let resumes = ResumeBatcher()
    /// Answers due after a delay (`PromptAnswer.after`), their connections suspended meanwhile. Those due within 5 ms of
    /// the soonest go together, in one wake of the alarms' thread and of the loop that sends them, not one wake each: the
    /// emulator holding calls for 3–6 s at 3,500 a second spent a fifth less per call (0.094–0.099 → 0.077–0.078 ms,
    /// the machine's CPU per receipt −9%; bench/README, forty-second round). A fault's latency is then up to 5 ms longer.
    let heldAnswers = Alarms(name: "storekeeper-http-held", slack: .milliseconds(5))
    /// The daemon as hand-offs see it: held while a socket is given to libmicrohttpd, so shutdown cannot stop the
    /// daemon under it. Its own lock, not `state`'s: libmicrohttpd may call back (notifications, requests) on the
    /// calling thread, and those callbacks take `state`.
    private let handOffTarget = Locked<DaemonHandle?>(nil)
    /// Sockets of terminated TLS connections handed to libmicrohttpd and not yet started there, with the host
    /// name each asked for; the connection-start notification moves the name onto the connection.
    private let pendingTunnels = Locked<[Int32: String]>([:])
    /// Connections the front has handed to libmicrohttpd that it has not closed yet. The front keeps these under
    /// `connectionLimit` itself and closes the rest: libmicrohttpd 0.9.75 leaves a polling thread holding its own
    /// lock when a handed-over connection finds that thread's limit reached, and that thread never serves again.
    /// (A connection libmicrohttpd drops before starting it, out of memory, is never counted back: a slot lost.)
    private let handedOff = Atomic<Int>(0)
    /// Whether shutdown has begun: every answer from then on closes its connection.
    private let draining = Atomic<Bool>(false)

    private struct State {
        // The daemon pointer is only touched under this lock.
        var daemon: DaemonHandle?
        /// Accepts connections itself when the server intercepts TLS (libmicrohttpd then has no listening socket).
        var front: ConnectionFront?
        /// Serves the front's HTTP/2 connections (cleartext, prior knowledge).
        var http2: HTTP2Service?
        var ports: [UInt16] = []
        var inFlight: [Int: Task<Void, Never>] = [:]
        var nextTaskID = 0
        var port: UInt16 = 0
        /// Connections suspended and not yet taken back by libmicrohttpd's thread. A response being ready is not
        /// enough: MHD_stop_daemon aborts the process while any connection is still suspended inside the library.
        var suspended = 0
        /// Set by shutdown once its grace has passed: answers held for a delay are due at once, new tasks cancelled, and
        /// a new request that would wait for its answer is answered 503 instead (`beginSuspension`).
        var stopping = false
        /// Set by shutdown, in the same hold of the lock that finds `suspended` zero, just before it stops
        /// libmicrohttpd (or when it gives up waiting): from then on no connection is suspended at all, not even for a
        /// held answer come due, so MHD_stop_daemon cannot find one (it aborts the process if it does).
        var closed = false
        /// Whether the last shutdown stopped libmicrohttpd (rather than giving up with connections still suspended).
        var stoppedDaemon = false
    }

    /// Requests whose responder is running now, or whose answer is held for a delay.
    public var requestsInFlight: Int {
        state.withLock { $0.inFlight.count + ($0.http2?.requestsInFlight.load(ordering: .relaxed) ?? 0) } + heldAnswers.count
    }

    func noteResumed() { state.withLock { $0.suspended -= 1 } }

    /// Counts a connection about to be suspended. Once shutdown is `stopping` only an admitted request's held answer
    /// come due (`continuing`) may wait again, so the count can only fall; once suspension is `closed`, nothing may.
    private func beginSuspension(continuing: Bool) -> Bool {
        state.withLock { state in
            guard !state.closed, continuing || !state.stopping else { return false }
            state.suspended += 1
            return true
        }
    }

    /// Sends an answer the responder was not asked for (a refusal from its admission, a body past its limit): logged,
    /// and told to the responder so that it counts it.
    func refuse(_ request: Request, with response: Response, startedAt: ContinuousClock.Instant, on connection: OpaquePointer) -> MHD_Result {
        log(request, status: response.status.code, bytes: response.body.count, started: startedAt)
        responder.refused(request, with: response)
        return send(response, on: connection)
    }

    /// Queues an answer on libmicrohttpd's thread.
    func send(_ response: Response, on connection: OpaquePointer) -> MHD_Result {
        queue(response, on: connection, closing: draining.load(ordering: .relaxed))
    }

    /// Where shutdown is (read by tests): draining (answers close their connections), stopping (past the grace), closed
    /// to suspension.
    var isDraining: Bool { draining.load(ordering: .relaxed) }
    /// HTTP/2 requests open and the bytes they hold (zeros without a front).
    var http2Held: (requests: Int, bytes: Int) {
        state.withLock { state in
            guard let http2 = state.http2 else { return (0, 0) }
            return (http2.heldRequests.load(ordering: .relaxed), http2.heldBytesNow.load(ordering: .relaxed))
        }
    }

    /// How many times the front looked at a waiting connection's first bytes (0 without a front).
    var frontPeeks: Int { state.withLock { $0.front?.peeks.load(ordering: .relaxed) ?? 0 } }
    var isStopping: Bool { state.withLock { $0.stopping } }
    var isClosedToSuspension: Bool { state.withLock { $0.closed } }
    var stoppedDaemon: Bool { state.withLock { $0.stoppedDaemon } }

    /// What a request gets once the server is stopping and would have had to wait for its answer.
    static let stoppingResponse: Response = {
        var response = HTTPError(.serviceUnavailable, code: "shutting_down", message: "The server is shutting down; try again.").response
        response.headers["Connection"] = "close"
        response.headers["Retry-After"] = "1"
        return response
    }()

    /// Creates a server; call `start()` to listen.
    public init(configuration: Configuration = Configuration(), responder: any Responder) {
        self.configuration = configuration
        self.responder = responder
    }

    /// The bound port once started.
    public var port: UInt16 { state.withLock { $0.port } }

    /// Every bound port once started: the main one, then the interception's extra ports.
    public var ports: [UInt16] { state.withLock { $0.ports } }

    /// Starts listening and returns the bound port.
    @discardableResult
    public func start() throws -> UInt16 {
        if let interception = configuration.interception { return try startIntercepting(interception) }
        let flags = UInt32(MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_EPOLL.rawValue | MHD_ALLOW_SUSPEND_RESUME.rawValue)
        // The server outlives its daemon (shutdown stops the daemon first), so an unretained pointer is safe.
        let context = Unmanaged.passUnretained(self).toOpaque()
        guard let daemon = shim_mhd_start(flags, configuration.port, configuration.host, accessHandler, context,
                                          completedHandler, context, connectionNotifier, context, configuration.connectionTimeout,
                                          configuration.connectionLimit, configuration.threads, configuration.connectionsPerIP) else {
            throw StartError(description: "cannot listen on \(configuration.host):\(configuration.port) (address in use or invalid)")
        }
        let bound = shim_mhd_bound_port(daemon)
        draining.store(false, ordering: .relaxed)
        state.withLock {
            $0.daemon = DaemonHandle(pointer: daemon)
            ($0.stopping, $0.closed, $0.stoppedDaemon) = (false, false, false)  // a server stopped before may start again
            $0.port = bound
            $0.ports = [bound]
        }
        return bound
    }

    /// libmicrohttpd without a listening socket, behind a `ConnectionFront` that owns the ports.
    private func startIntercepting(_ interception: Configuration.Interception) throws -> UInt16 {
        let tls: TLSServerContext
        do {
            tls = try TLSServerContext(certificateChainPEM: interception.certificateChainPEM, privateKeyPEM: interception.privateKeyPEM,
                                       hosts: interception.hosts)
        } catch { throw StartError(description: "TLS: \(error.description)") }
        let flags = UInt32(MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_EPOLL.rawValue | MHD_ALLOW_SUSPEND_RESUME.rawValue
                           | MHD_USE_NO_LISTEN_SOCKET.rawValue | MHD_USE_ITC.rawValue)
        let context = Unmanaged.passUnretained(self).toOpaque()
        // libmicrohttpd splits its limit between its threads; each gets the whole of it here, so that no thread
        // reaches its own share while the front admits no more than `connectionLimit` (see `handedOff`).
        let threads = max(configuration.threads, 1)
        let (perThreadLimit, overflow) = configuration.connectionLimit.multipliedReportingOverflow(by: threads)
        guard let daemon = shim_mhd_start(flags, 0, configuration.host, accessHandler, context, completedHandler, context,
                                          connectionNotifier, context, configuration.connectionTimeout, overflow ? .max : perThreadLimit,
                                          threads, configuration.connectionsPerIP) else {
            throw StartError(description: "cannot start the HTTP daemon")
        }
        let front: ConnectionFront
        let http2: HTTP2Service
        do {
            http2 = try HTTP2Service(server: self)
        } catch {
            MHD_stop_daemon(daemon)
            throw error
        }
        do {
            front = try ConnectionFront(host: configuration.host, ports: [configuration.port] + interception.extraPorts, tls: tls,
                                        handOff: { [weak self] socket, peer, tunnel in
                                            guard let self else {
                                                close(socket)
                                                return
                                            }
                                            handOff(socket, peer: peer, tunnel: tunnel)
                                        },
                                        handOffHTTP2: { [weak self] socket in
                                            // The same limit as libmicrohttpd's connections: the front holds both kinds.
                                            guard let self, takeConnectionSlot() else {
                                                close(socket)
                                                return
                                            }
                                            http2.post(.adopt(socket, tunnel: nil))
                                        })
        } catch {
            http2.stop()
            MHD_stop_daemon(daemon)
            throw StartError(description: error.description)
        }
        state.withLock {
            $0.daemon = DaemonHandle(pointer: daemon)
            ($0.stopping, $0.closed, $0.stoppedDaemon) = (false, false, false)  // a server stopped before may start again
            $0.front = front
            $0.http2 = http2
            $0.port = front.ports[0]
            $0.ports = front.ports
        }
        handOffTarget.withLock { $0 = DaemonHandle(pointer: daemon) }
        draining.store(false, ordering: .relaxed)
        front.start()
        return front.ports[0]
    }

    /// Gives an accepted (or tunnelled) socket to libmicrohttpd, or closes it once the daemon is stopping.
    private func handOff(_ socket: Int32, peer: sockaddr_in, tunnel: String?) {
        var peer = peer
        handOffTarget.withLock { target in
            guard let daemon = target?.pointer else {
                close(socket)
                return
            }
            guard takeConnectionSlot() else {
                close(socket)
                return
            }
            if let tunnel { pendingTunnels.withLock { $0[socket] = tunnel } }
            // libmicrohttpd closes the socket itself when it cannot take it.
            let added = withUnsafePointer(to: &peer) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { MHD_add_connection(daemon, socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            if added != .YES {
                _ = pendingTunnels.withLock { $0.removeValue(forKey: socket) }
                handedOff.wrappingSubtract(1, ordering: .relaxed)
            }
        }
    }

    /// Takes one of the `connectionLimit` places the front's connections share (libmicrohttpd's and HTTP/2's alike).
    func takeConnectionSlot() -> Bool {
        guard handedOff.wrappingAdd(1, ordering: .relaxed).newValue <= Int(configuration.connectionLimit) else {
            handedOff.wrappingSubtract(1, ordering: .relaxed)
            return false
        }
        return true
    }

    /// Gives back a place taken by `takeConnectionSlot`.
    func releaseConnectionSlot() { handedOff.wrappingSubtract(1, ordering: .relaxed) }

    /// libmicrohttpd started a connection.
    func noteStarted() { configuration.openConnections.value.wrappingAdd(1, ordering: .relaxed) }

    /// libmicrohttpd closed a connection it had started.
    func noteClosed() {
        configuration.openConnections.value.wrappingSubtract(1, ordering: .relaxed)
        if configuration.interception != nil { handedOff.wrappingSubtract(1, ordering: .relaxed) }
    }

    /// The tunnel host recorded for a socket libmicrohttpd starts serving, taken once.
    func takeTunnel(socket: Int32) -> String? {
        pendingTunnels.withLock { $0.removeValue(forKey: socket) }
    }

    /// Stops accepting connections, lets requests in flight finish (cancelling after `grace`), and stops.
    /// Takes at most `grace` plus 10 s (5 s for cancelled work to end, 5 s for libmicrohttpd to take connections back).
    public func shutdown(grace: Duration = .seconds(5)) async {
        guard let daemon = state.withLock({ $0.daemon?.pointer }) else { return }
        draining.store(true, ordering: .relaxed)
        // After quiescing, the listening socket belongs to us: close it so new clients are refused at once.
        if let front = state.withLock({ $0.front }) {
            front.stop()
        } else {
            let listener = MHD_quiesce_daemon(daemon)
            if listener >= 0 { close(listener) }
        }
        let deadline = ContinuousClock.now.advanced(by: grace)
        while requestsInFlight > 0 && ContinuousClock.now < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
        // Held answers are due now (their delay cut short, as a cancelled task's sleep is), and tasks are cancelled,
        // those a held answer hands over to included.
        let tasks = state.withLock { state -> [Task<Void, Never>] in
            state.stopping = true
            return Array(state.inFlight.values)
        }
        heldAnswers.fireAll()
        for task in tasks { task.cancel() }
        // A responder deaf to cancellation (blocked in C, say) keeps its connection suspended: after 5 s the server
        // stops without stopping libmicrohttpd (below) rather than never.
        let cancelDeadline = ContinuousClock.now.advanced(by: .seconds(5))
        while state.withLock({ !$0.inFlight.isEmpty }) && ContinuousClock.now < cancelDeadline {
            try? await Task.sleep(for: .milliseconds(10))
        }
        // HTTP/2 connections end here: their held answers fired and their tasks cancelled above, what they answered is sent.
        state.withLock { $0.http2 }?.stop()
        // Resumed connections are taken back by libmicrohttpd's own threads, which may not have run yet on a busy machine.
        // Once none is suspended, suspension closes in the same hold of the lock (see `State.closed`).
        let resumeDeadline = ContinuousClock.now.advanced(by: .seconds(5))
        var closed = false
        while true {
            closed = state.withLock { state in
                guard state.suspended == 0 else { return false }
                state.closed = true
                return true
            }
            if closed || ContinuousClock.now >= resumeDeadline { break }
            try? await Task.sleep(for: .milliseconds(10))
        }
        handOffTarget.withLock { $0 = nil }  // waits for a hand-off in progress; later ones close their socket
        state.withLock { $0.daemon = nil }
        // Stopping with a connection still suspended aborts inside libmicrohttpd; leaving the daemon to the
        // process's exit is the lesser harm (it no longer listens).
        guard closed else {
            // libmicrohttpd's threads go on until the process exits, calling back into this server through an
            // unretained pointer: it is kept alive for them, and suspends nothing more.
            state.withLock { $0.closed = true }
            _ = Unmanaged.passRetained(self)
            FileHandle.standardError.write(Data("HTTP server: connections still suspended at shutdown; not stopping the daemon\n".utf8))
            return
        }
        MHD_stop_daemon(daemon)
        state.withLock {
            $0.http2 = nil
            $0.front = nil
            $0.stoppedDaemon = true
        }
    }

    /// Carries out a responder's prompt answer on libmicrohttpd's thread: sends a response now, or suspends the
    /// connection and runs a task or holds the answer for its delay.
    /// `continuing`: the answer of a held answer come due, for a request already admitted (see `beginSuspension`).
    func carryOut(_ answer: PromptAnswer, for request: Request, context: RequestContext, connection: OpaquePointer, continuing: Bool = false) -> MHD_Result {
        if case .now(let response) = answer {
            log(request, status: response.dropConnection ? 0 : response.status.code, bytes: response.body.count,
                started: context.fields.withLock { $0.startedAt }, response: response)
            return send(response, on: connection)
        }
        guard beginSuspension(continuing: continuing) else {
            let response = Self.stoppingResponse
            log(request, status: response.status.code, bytes: response.body.count, started: context.fields.withLock { $0.startedAt }, response: response)
            return send(response, on: connection)
        }
        context.fields.withLock { $0.suspended = true }
        MHD_suspend_connection(connection)
        switch answer {
        case .now: break  // sent above
        case .later(let work): dispatch(work, context: context, connection: connection)
        case .after(let delay, let next): hold(next, after: delay, context: context, connection: connection)
        }
        return .YES
    }

    /// Once `delay` has passed the connection is resumed with `next` in its context, and libmicrohttpd's thread, called
    /// for it again, carries out what `next` answers then: the timer's one thread only resumes, and the answers' work
    /// is spread over libmicrohttpd's threads as prompt answers are. A server stopping holds nothing.
    private func hold(_ next: @escaping @Sendable () -> PromptAnswer, after delay: Duration, context: RequestContext, connection: OpaquePointer) {
        let connectionBox = ConnectionHandle(pointer: connection)
        // `self` is held strongly: libmicrohttpd, which will call back into it once resumed, holds it unretained.
        let due: @Sendable () -> Void = { [self] in
            context.fields.withLock { $0.due = next }
            resumes.resume(connectionBox, suspended: state.withLock { $0.suspended })
        }
        if state.withLock({ $0.stopping }) {
            due()
            return
        }
        let alarm = heldAnswers.schedule(after: delay, due)
        // Shutdown may have fired every held answer between the check above and the schedule: this one is due now too.
        if state.withLock({ $0.stopping }) { heldAnswers.fireNow(alarm) }
    }

    func dispatch(_ work: @escaping @Sendable () async -> Response, context: RequestContext, connection: OpaquePointer) {
        let taskID = state.withLock { state -> Int in
            state.nextTaskID += 1
            return state.nextTaskID
        }
        let connectionBox = ConnectionHandle(pointer: connection)
        let task = Task { [weak self] in
            let response = await work()
            context.complete(with: response)
            guard let self else {
                MHD_resume_connection(connectionBox.pointer)
                return
            }
            let suspended = state.withLock { state -> Int in
                state.inFlight.removeValue(forKey: taskID)
                return state.suspended
            }
            resumes.resume(connectionBox, suspended: suspended)
        }
        let stopping = state.withLock { state -> Bool in
            // The task may already have finished; only track it while it runs.
            if !context.isComplete { state.inFlight[taskID] = task }
            return state.stopping
        }
        // Started after shutdown cancelled the tasks in flight (a held answer handed over): cancelled too.
        if stopping { task.cancel() }
    }

    func log(_ request: Request, status: Int, bytes: Int, started: ContinuousClock.Instant, response: Response? = nil) {
        guard configuration.accessLog else { return }
        let elapsed = ContinuousClock.now - started
        let millis = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
        if configuration.logFormat == .json {
            FileHandle.standardError.write(Data(AccessLogLine.json(request, status: status, bytes: bytes, millis: millis, response: response).utf8))
            return
        }
        // Control characters in a path (or an invented method) would forge log lines: shown escaped.
        func clean(_ text: String) -> String {
            String(String.UnicodeScalarView(text.prefix(512).unicodeScalars.flatMap { $0.value < 0x20 || $0.value == 0x7f ? Array("\\x\(String($0.value, radix: 16))".unicodeScalars) : [$0] }))
        }
        let line = "\(clean(request.method.rawValue)) \(clean(request.path)) \(status) \(bytes)B \(String(format: "%.1f", millis))ms\n"
        FileHandle.standardError.write(Data(line.utf8))
    }
}

/// Hands answered connections back to libmicrohttpd. Each resume wakes the daemon's thread, which then walks its whole
/// list of suspended connections to find those resuming: with thousands suspended (an App Store emulator holding
/// calls for seconds of latency) that walk was 18% of the process. Past `batchedAbove` suspended connections, resumes
/// are gathered and handed back together, so one walk serves them all; below it, at once.
///
/// Gathering for a fixed 2 ms still left the walks at 22–30% of an emulator holding 8,000 calls: up to 500 walks a
/// second of the whole list. So a batch waits `delay(suspended:)`, 2 µs per suspended connection (between 2 and
/// 40 ms): up to 20,000 suspended the connections walked per second stay near half a million (past that they grow
/// with the list), and an answer waits at most that long more, only while more than 512 others wait too.
final class ResumeBatcher: Sendable {
    static let batchedAbove = 512

    /// How long a batch gathers resumes while `suspended` connections are held.
    static func delay(suspended: Int) -> DispatchTimeInterval {
        .microseconds(min(40_000, max(2_000, suspended * 2)))
    }

    /// Waiting for the next batch; a batch is scheduled whenever this is not empty.
    private let pending = Locked<[ConnectionHandle]>([])
    private let queue = DispatchQueue(label: "storekeeper.http.resume")
    /// Connections handed back in a batch so far.
    let batched = Atomic<Int>(0)

    func resume(_ connection: ConnectionHandle, suspended: Int) {
        guard suspended > Self.batchedAbove else {
            MHD_resume_connection(connection.pointer)
            return
        }
        let first = pending.withLock { pending -> Bool in
            pending.append(connection)
            return pending.count == 1
        }
        guard first else { return }
        queue.asyncAfter(deadline: .now() + Self.delay(suspended: suspended)) { [self] in
            let batch = pending.withLock { pending -> [ConnectionHandle] in
                defer { pending = [] }
                return pending
            }
            batched.add(batch.count, ordering: .relaxed)
            for connection in batch { MHD_resume_connection(connection.pointer) }
        }
    }
}

/// The libmicrohttpd daemon pointer, kept under the server's lock.
// Only start() and shutdown() use it, and libmicrohttpd's daemon calls are thread-safe.
struct DaemonHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// A libmicrohttpd connection pointer carried into a task.
// MHD_resume_connection is documented as callable from any thread, so sending the pointer is safe.
struct ConnectionHandle: @unchecked Sendable {
    let pointer: OpaquePointer
}

/// Per-request state kept between libmicrohttpd callbacks.
final class RequestContext: Sendable {
    struct Fields {
        var body = Data()
        var bodyLimit = Int.max
        var tooLarge = false
        /// A refusal decided from the headers, sent once the (discarded) body has arrived.
        var refusal: Response?
        var started = false
        var response: Response?
        var startedAt = ContinuousClock.now
        var request: Request?
        /// Suspended for the responder and not yet taken back (see `HTTPServer.State.suspended`).
        var suspended = false
        /// A held answer come due (`PromptAnswer.after`): carried out when libmicrohttpd calls for the connection again.
        var due: (@Sendable () -> PromptAnswer)?
    }
    let fields = Locked(Fields())

    var isComplete: Bool { fields.withLock { $0.response != nil } }

    func complete(with response: Response) { fields.withLock { $0.response = response } }

    /// Whether the connection was suspended and not yet taken back; it is marked taken back.
    func takeBack() -> Bool {
        fields.withLock { fields in
            defer { fields.suspended = false }
            return fields.suspended
        }
    }
}

/// What a connection carried in from a terminated TLS tunnel: the host name its client asked for.
final class TunnelMark {
    let host: String
    init(host: String) { self.host = host }
}

/// Marks connections that came through a TLS tunnel when libmicrohttpd starts them, and frees the mark when
/// it closes them.
private let connectionNotifier: MHD_NotifyConnectionCallback = { cls, connection, socketContext, code in
    guard let cls, let connection, let socketContext else { return }
    switch code {
    case .CONNECTION_NOTIFY_STARTED:
        let server = Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue()
        server.noteStarted()
        let socket = shim_mhd_connection_fd(connection)
        if socket >= 0, let host = server.takeTunnel(socket: socket) {
            socketContext.pointee = Unmanaged.passRetained(TunnelMark(host: host)).toOpaque()
        }
    case .CONNECTION_NOTIFY_CLOSED:
        Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue().noteClosed()
        if let mark = socketContext.pointee {
            Unmanaged<TunnelMark>.fromOpaque(mark).release()
            socketContext.pointee = nil
        }
    default:
        break
    }
}

/// A count of connections open, shared between a server that keeps it and whoever sizes things by it.
public final class ConnectionCount: Sendable {
    let value = Atomic<Int>(0)

    public init() {}

    /// Connections open now.
    public var count: Int { value.load(ordering: .relaxed) }
}

/// Collects key/value pairs from libmicrohttpd iterators.
final class PairCollector {
    var pairs: [String: String] = [:]
    var items: [(name: String, value: String)] = []
    /// Query arguments: decode the escapes libmicrohttpd kept (headers are never escaped).
    var finishesDecoding = false
}

private let collectPair: MHD_KeyValueIterator = { cls, _, key, value in
    guard let cls, let key else { return .YES }
    let collector = Unmanaged<PairCollector>.fromOpaque(cls).takeUnretainedValue()
    var name = String(cString: key), text = value.map { String(cString: $0) } ?? ""
    if collector.finishesDecoding {
        // The escapes libmicrohttpd left (see shim_unescape_keeping_structure) are decoded here, once.
        name = HTTPText.percentDecoded(name[...])
        text = HTTPText.percentDecoded(text[...])
    }
    collector.pairs[name] = text
    collector.items.append((name, text))
    return .YES
}

/// Queues `response` on the connection; `closing` (the server is shutting down) adds `Connection: close`, so that
/// kept-alive clients move off the connection instead of sending it more requests.
private func queue(_ response: Response, on connection: OpaquePointer, closing: Bool) -> MHD_Result {
    if response.dropConnection { return .NO }
    let mhdResponse = response.body.withUnsafeBytes { buffer in
        MHD_create_response_from_buffer(buffer.count, UnsafeMutableRawPointer(mutating: buffer.baseAddress), .RESPMEM_MUST_COPY)
    }
    guard let mhdResponse else { return .NO }
    for (name, value) in response.headers { MHD_add_response_header(mhdResponse, name, value) }
    if closing && response.headers["Connection"] == nil { MHD_add_response_header(mhdResponse, "Connection", "close") }
    let result = MHD_queue_response(connection, UInt32(response.status.code), mhdResponse)
    MHD_destroy_response(mhdResponse)
    return result
}

// libmicrohttpd calls this on its own threads: once when headers arrive, once per body chunk, and
// once more when the body is complete (and again after each resume).
private let accessHandler: MHD_AccessHandlerCallback = { cls, connection, url, method, _, uploadData, uploadSize, requestContext in
    guard let cls, let connection, let requestContext, let uploadSize else { return .NO }
    let server = Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue()

    guard let existing = requestContext.pointee else {
        let context = RequestContext()
        let headers = PairCollector()
        MHD_get_connection_values(connection, .HEADER_KIND, collectPair, Unmanaged.passUnretained(headers).toOpaque())
        let requestMethod = HTTPMethod(rawValue: method.map { String(cString: $0) } ?? "GET")
        let target = url.map { String(cString: $0) } ?? "/"
        var request = Request(method: requestMethod, target: target, headers: headers.pairs)
        let declared = request.headers["content-length"].flatMap { Int($0) }
        if let mark = shim_mhd_socket_context(connection) {
            request.tunnel = Unmanaged<TunnelMark>.fromOpaque(mark).takeUnretainedValue().host
        }
        // Limits and authentication before a byte of the body is read: refusals go out now.
        let head = RequestHead(request, contentLength: declared)
        var refusal: Response?
        var limit = server.configuration.maxBodySize
        switch server.responder.admit(head) {
        case .refuse(let response): refusal = response
        case .accept(let bodyLimit): limit = min(limit, bodyLimit)
        }
        if refusal == nil, let declared, declared > limit {
            refusal = HTTPError(.payloadTooLarge, code: "payload_too_large", message: "The request body exceeds \(limit) bytes.").response
        }
        context.fields.withLock { fields in
            fields.bodyLimit = limit
            fields.request = request
        }
        // Released in completedHandler when libmicrohttpd is done with the request.
        requestContext.pointee = Unmanaged.passRetained(context).toOpaque()
        if let refusal {
            // A body of a few MiB is read and thrown away so that clients which write the whole body before
            // reading (most do) see the answer; a larger or unbounded one gets it at once, and the connection closes.
            if let declared, declared <= HTTPServer.drainLimit {
                context.fields.withLock { $0.refusal = refusal }
                return .YES
            }
            return server.refuse(request, with: refusal, startedAt: context.fields.withLock { $0.startedAt }, on: connection)
        }
        return .YES
    }
    let context = Unmanaged<RequestContext>.fromOpaque(existing).takeUnretainedValue()

    if uploadSize.pointee > 0 {
        let size = uploadSize.pointee
        let late = context.fields.withLock { fields -> Bool in
            if fields.refusal == nil, !fields.tooLarge, let uploadData {
                if fields.body.count + size > fields.bodyLimit {
                    fields.tooLarge = true
                    fields.body = Data()
                } else {
                    uploadData.withMemoryRebound(to: UInt8.self, capacity: size) { fields.body.append($0, count: size) }
                }
            }
            return ContinuousClock.now - fields.startedAt > .seconds(server.configuration.requestDeadline)
        }
        // A body trickling in past the request deadline: close the connection (a slow upload holds no buffer forever).
        if late { return .NO }
        uploadSize.pointee = 0
        return .YES
    }

    let (ready, tooLarge, started, request, due) = context.fields.withLock { ($0.response, $0.tooLarge, $0.started, $0.request, $0.due) }
    if let ready, let request {
        if context.takeBack() { server.noteResumed() }
        server.log(request, status: ready.dropConnection ? 0 : ready.status.code, bytes: ready.body.count,
                   started: context.fields.withLock { $0.startedAt }, response: ready)
        return server.send(ready, on: connection)
    }
    if let request, let due {
        context.fields.withLock { $0.due = nil }
        // Still counted as suspended until what `due` answers is carried out (and, if it waits again, counted anew):
        // shutdown cannot close suspension between the two and refuse a request whose answer has begun.
        let wasSuspended = context.takeBack()
        let result = server.carryOut(due(), for: request, context: context, connection: connection, continuing: true)
        if wasSuspended { server.noteResumed() }
        return result
    }
    guard var request, !started else { return .YES }
    if let refusal = context.fields.withLock({ $0.refusal }) {
        return server.refuse(request, with: refusal, startedAt: context.fields.withLock { $0.startedAt }, on: connection)
    }
    if tooLarge {
        let limit = context.fields.withLock { $0.bodyLimit }
        let response = HTTPError(.payloadTooLarge, code: "payload_too_large", message: "The request body exceeds \(limit) bytes.").response
        return server.refuse(request, with: response, startedAt: context.fields.withLock { $0.startedAt }, on: connection)
    }
    let query = PairCollector()
    query.finishesDecoding = true
    MHD_get_connection_values(connection, .GET_ARGUMENT_KIND, collectPair, Unmanaged.passUnretained(query).toOpaque())
    request.query = query.pairs
    request.queryItems = query.items
    request.body = context.fields.withLock { fields in
        fields.started = true
        // The body is the request's now; the context keeps no second copy while it is answered.
        defer { fields.body = Data() }
        return fields.body
    }
    return server.carryOut(server.responder.respondPromptly(to: request), for: request, context: context, connection: connection)
}

private let completedHandler: MHD_RequestCompletedCallback = { cls, _, requestContext, _ in
    guard let requestContext, let pointer = requestContext.pointee else { return }
    let context = Unmanaged<RequestContext>.fromOpaque(pointer)
    // A connection closed while suspended (the client went away) is taken back here instead.
    if let cls, context.takeUnretainedValue().takeBack() {
        Unmanaged<HTTPServer>.fromOpaque(cls).takeUnretainedValue().noteResumed()
    }
    context.release()
    requestContext.pointee = nil
}

/// One access log line as a JSON object: time, level, request id, method, route, path, status, latency, bytes.
enum AccessLogLine {
    static func json(_ request: Request, status: Int, bytes: Int, millis: Double, response: Response?) -> String {
        func quoted(_ text: String) -> String {
            var out = "\""
            for scalar in text.unicodeScalars {
                switch scalar {
                case "\"": out += "\\\""
                case "\\": out += "\\\\"
                case _ where scalar.value < 0x20 || scalar.value == 0x7f: out += String(format: "\\u%04x", scalar.value)
                default: out.unicodeScalars.append(scalar)
                }
            }
            return out + "\""
        }
        let time = ISO8601DateFormatter().string(from: Date())
        var fields = ["\"time\":\(quoted(time))", "\"level\":\(quoted(status >= 500 ? "error" : status >= 400 ? "warn" : "info"))",
                      "\"method\":\(quoted(String(request.method.rawValue.prefix(16))))", "\"path\":\(quoted(String(request.path.prefix(512))))",
                      "\"status\":\(status)", "\"latencyMs\":\(String(format: "%.1f", millis))", "\"bytes\":\(bytes)"]
        if let route = response?.route { fields.append("\"route\":\(quoted(route))") }
        if let id = response?.headers["X-Request-Id"] { fields.append("\"requestId\":\(quoted(id))") }
        return "{" + fields.joined(separator: ",") + "}\n"
    }
}
