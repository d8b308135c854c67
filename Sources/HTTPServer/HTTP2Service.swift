import CNGHTTP2
import HTTP2Wire
import CSystem
import Clocks
import Foundation
import HTTP
import Locking
import Synchronization

/// Serves HTTP/2 over cleartext with prior knowledge (RFC 9113 §3.3) on the connections the front recognises by
/// their preface, with nghttp2 doing the framing, HPACK and flow control. Every request goes to the same responder,
/// through the same admission, body limit, prompt answers, held answers and access log as HTTP/1.1.
///
/// Why: a client calling with thousands of requests in flight (the purchase server waiting seconds on Apple) needs a
/// socket per request over HTTP/1.1, and a process's descriptors run out first; over HTTP/2 they share a few.
///
/// One thread owns every HTTP/2 connection (epoll). Others reach it only through `post` (a locked inbox and an
/// eventfd): a task's answer, a held answer come due, a socket from the front, the stop.
///
/// What a hostile client can hold is bounded for the whole service, not per connection: requests open (receiving,
/// or being answered by a task or a held answer, even after the client reset the stream) and the bytes of their
/// headers and bodies. Past either bound new streams are refused (REFUSED_STREAM, which a client may retry). A request
/// still arriving after the server's request deadline is reset, as is an answer the client does not take (a closed
/// window) within the connection timeout; a connection with nothing open for the connection timeout is sent GOAWAY and
/// closed a second later.
final class HTTP2Service: @unchecked Sendable {  // the loop's fields are touched only on its thread
    /// Concurrent streams one connection may open (SETTINGS_MAX_CONCURRENT_STREAMS); a client needing more opens
    /// another connection.
    static let maxConcurrentStreams: UInt32 = 4096
    /// Bytes of one request's header block (names and values, 32 more per field as HPACK counts) at most; past it the
    /// stream is reset.
    static let maxHeaderBytes = 64 << 10
    /// Requests open at once in the whole service (each holds a stream or a task).
    static let maxOpenRequests = 65_536
    /// Bytes of header blocks and bodies the service's open requests hold at most.
    static let maxHeldBytes = 1 << 30
    /// Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE) and the connection's.
    static let streamWindow: Int32 = 1 << 20
    static let connectionWindow: Int32 = 64 << 20
    /// Bytes read from one connection before the others get their turn.
    static let readBudget = 1 << 20

    enum Message {
        case adopt(Int32, tunnel: String?)
        /// A task's answer; `charge` is what its request held (released now, whether or not the stream is still open).
        case answer(connection: UInt64, stream: Int32, Response, charge: Int)
        case due(connection: UInt64, stream: Int32, @Sendable () -> PromptAnswer, charge: Int)
        case stop
    }

    /// Held strongly (the server keeps this service until its shutdown stops it).
    private let server: HTTPServer
    private let epoll: Int32
    private let wakeFD: Int32
    private let inbox = Locked<(messages: [Message], stopped: Bool)>(([], false))
    /// Tasks answering HTTP/2 requests now, readable from any thread (held answers are the server's `heldAnswers`).
    let requestsInFlight = Atomic<Int>(0)
    private let finished = DispatchSemaphore(value: 0)

    // Owned by the loop thread.
    private var connections: [UInt64: HTTP2ServerConnection] = [:]
    private var nextID: UInt64 = 0
    private let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256 << 10, alignment: 16)
    private var lastSweep = ContinuousClock.now
    /// Connections that had more to read when their budget ran out (edge-triggered: no new event will say so).
    private var moreToRead: [UInt64] = []
    /// Requests open and the bytes they hold (see the type's comment), and the same readable from any thread.
    private(set) var openRequests = 0 {
        didSet { heldRequests.store(openRequests, ordering: .relaxed) }
    }
    private(set) var heldBytes = 0 {
        didSet { heldBytesNow.store(heldBytes, ordering: .relaxed) }
    }
    let heldRequests = Atomic<Int>(0)
    let heldBytesNow = Atomic<Int>(0)
    /// Set by `.stop`: tasks are cancelled, and the loop ends once their answers are in or two seconds pass.
    private var stopDeadline: ContinuousClock.Instant?
    /// Callers of `stop` waiting for the loop to end.
    private var stopsWaiting = 0

    init(server: HTTPServer) throws(HTTPServer.StartError) {
        self.server = server
        epoll = epoll_create1(Int32(EPOLL_CLOEXEC))
        wakeFD = eventfd(0, Int32(EFD_NONBLOCK) | Int32(EFD_CLOEXEC))
        guard epoll >= 0, wakeFD >= 0 else { throw HTTPServer.StartError(description: "epoll/eventfd: \(String(cString: strerror(errno)))") }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue
        event.data.u64 = 0
        epoll_ctl(epoll, EPOLL_CTL_ADD, wakeFD, &event)
        let thread = Thread { [self] in run() }
        thread.name = "storekeeper-http2"
        thread.start()
    }

    deinit {
        close(epoll)
        close(wakeFD)
        readBuffer.deallocate()
    }

    /// Hands a message to the loop; false once the service has stopped (an adopted socket is then closed here).
    @discardableResult
    func post(_ message: Message) -> Bool {
        let (accepted, wake) = inbox.withLock { state -> (Bool, Bool) in
            guard !state.stopped else { return (false, false) }
            state.messages.append(message)
            return (true, state.messages.count == 1)
        }
        if !accepted { discard(message) }
        if wake {
            var one: UInt64 = 1
            _ = write(wakeFD, &one, 8)
        }
        return accepted
    }

    /// What a message that will never be handled still owes: its socket closed, its task counted out.
    private func discard(_ message: Message) {
        switch message {
        case .adopt(let socket, _):
            close(socket)
            server.releaseConnectionSlot()
        case .answer: requestsInFlight.wrappingSubtract(1, ordering: .relaxed)
        case .due: break
        case .stop: finished.signal()  // a second stop, after the first ended the loop
        }
    }

    /// Cancels the tasks answering, waits up to two seconds for their answers, sends them, then ends every connection
    /// (GOAWAY) and waits for the loop to finish.
    func stop() {
        guard post(.stop) else { return }
        finished.wait()
    }

    // MARK: - The loop

    private func run() {
        var events = [epoll_event](repeating: epoll_event(), count: 256)
        while true {
            let count = epoll_wait(epoll, &events, Int32(events.count), moreToRead.isEmpty ? 250 : 0)
            var readable = moreToRead
            moreToRead = []
            if count > 0 {
                for index in 0..<Int(count) where events[index].data.u64 != 0 { readable.append(events[index].data.u64) }
                if events[0..<Int(count)].contains(where: { $0.data.u64 == 0 }) {
                    var value: UInt64 = 0
                    _ = read(wakeFD, &value, 8)
                }
            }
            for id in readable { if let connection = connections[id] { drive(connection) } }
            let messages = inbox.withLock { state in
                defer { state.messages.removeAll(keepingCapacity: true) }
                return state.messages
            }
            var touched: [UInt64: HTTP2ServerConnection] = [:]
            for message in messages {
                switch message {
                case .adopt(let socket, let tunnel): adopt(socket, tunnel: tunnel)
                case .answer(let id, let stream, let response, let charge):
                    requestsInFlight.wrappingSubtract(1, ordering: .relaxed)
                    release(requests: 1, bytes: charge)
                    guard let connection = connections[id] else { continue }
                    connection.answer(stream, with: response)
                    touched[id] = connection
                case .due(let id, let stream, let next, let charge):
                    release(requests: 1, bytes: charge)
                    // A stream the client reset (or a connection gone) starts no work its answer would have started.
                    guard let connection = connections[id], connection.isOpen(stream) else { continue }
                    connection.carryOut(next(), stream: stream)
                    touched[id] = connection
                case .stop:
                    stopsWaiting += 1
                    guard stopDeadline == nil else { continue }
                    stopDeadline = ContinuousClock.now + .seconds(2)
                    for connection in connections.values { connection.cancelTasks() }
                }
            }
            for connection in touched.values { flush(connection) }
            if let stopDeadline, requestsInFlight.load(ordering: .relaxed) <= 0 || ContinuousClock.now >= stopDeadline {
                finish()
                return
            }
            if ContinuousClock.now - lastSweep > .seconds(1) {
                lastSweep = ContinuousClock.now
                sweep()
            }
        }
    }

    /// The loop's end: every connection sent GOAWAY and what it has, then closed; messages still in the inbox discarded.
    private func finish() {
        for connection in Array(connections.values) {
            _ = connection.send()  // the answers first, then GOAWAY (nghttp2 sends it ahead of DATA still queued)
            connection.terminate()
            _ = connection.send()
            end(connection)
        }
        let left = inbox.withLock { state -> [Message] in
            state.stopped = true
            defer { state.messages = [] }
            return state.messages
        }
        for message in left { discard(message) }
        for _ in 0..<stopsWaiting { finished.signal() }
    }

    private func adopt(_ socket: Int32, tunnel: String?) {
        guard stopDeadline == nil else {
            close(socket)
            server.releaseConnectionSlot()
            return
        }
        nextID += 1
        guard let connection = HTTP2ServerConnection(id: nextID, socket: socket, tunnel: tunnel, service: self) else {
            close(socket)
            server.releaseConnectionSlot()
            return
        }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue | EPOLLOUT.rawValue | EPOLLRDHUP.rawValue | EPOLLET.rawValue
        event.data.u64 = connection.id
        guard epoll_ctl(epoll, EPOLL_CTL_ADD, socket, &event) == 0 else {
            connection.closeSocket()
            server.releaseConnectionSlot()
            return
        }
        connections[connection.id] = connection
        server.configuration.openConnections.value.wrappingAdd(1, ordering: .relaxed)
        drive(connection)
    }

    /// Reads what arrived (up to the read budget), feeds it to nghttp2, and writes what it has to send.
    private func drive(_ connection: HTTP2ServerConnection) {
        var taken = 0
        while true {
            guard taken < Self.readBudget else {
                moreToRead.append(connection.id)
                break
            }
            let count = recv(connection.socket, readBuffer.baseAddress, readBuffer.count, 0)
            if count > 0 {
                taken += count
                connection.lastActivity = ContinuousClock.now
                guard connection.receive(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count])) else {
                    end(connection)
                    return
                }
            } else if count == 0 {
                end(connection)
                return
            } else if errno == EINTR {
                continue
            } else if errno == EAGAIN || errno == EWOULDBLOCK {
                break
            } else {
                end(connection)
                return
            }
        }
        flush(connection)
    }

    private func flush(_ connection: HTTP2ServerConnection) {
        guard connections[connection.id] != nil else { return }
        // After its own GOAWAY a connection with nothing open is wanted no more; the sweep closes it a second later, so
        // that a request the client sent meanwhile is refused by the GOAWAY it reads rather than cut by a reset.
        if !connection.send() || (!connection.isWanted && connection.goAwaySince == nil) { end(connection) }
    }

    private func end(_ connection: HTTP2ServerConnection) {
        guard connections.removeValue(forKey: connection.id) != nil else { return }
        epoll_ctl(epoll, EPOLL_CTL_DEL, connection.socket, nil)
        connection.closeSocket()
        server.configuration.openConnections.value.wrappingSubtract(1, ordering: .relaxed)
        server.releaseConnectionSlot()
    }

    /// Each second: requests past their deadlines reset, connections idle past the connection timeout sent GOAWAY, and
    /// those that were sent it with nothing left open closed.
    private func sweep() {
        let now = ContinuousClock.now
        let idle = Duration.seconds(Int(server.configuration.connectionTimeout))
        let arriving = Duration.milliseconds(Int(server.configuration.requestDeadline * 1000))
        for connection in Array(connections.values) {
            // A client that stopped reading: nothing it is sent (resets included) can reach it.
            if connection.isBlocked && now - connection.lastWritten > idle {
                end(connection)
                continue
            }
            connection.resetOverdue(now: now, arriving: arriving, unread: idle)
            if connection.streams.isEmpty {
                if let since = connection.goAwaySince {
                    if now - since >= .seconds(1) {
                        end(connection)
                        continue
                    }
                } else if now - connection.lastActivity > idle {
                    connection.goAway()
                }
            }
            flush(connection)
        }
    }

    // MARK: - What connections ask of the service

    var responder: any Responder { server.responder }
    var maxBodySize: Int { server.configuration.maxBodySize }
    var isDraining: Bool { server.isDraining }
    var isStopping: Bool { stopDeadline != nil || server.isStopping }

    /// Takes room for a new request, or says there is none (the stream is then refused).
    func admitRequest() -> Bool {
        guard openRequests < Self.maxOpenRequests, heldBytes < Self.maxHeldBytes else { return false }
        openRequests += 1
        return true
    }

    /// Takes a place for a request the service already holds (a held answer holding again).
    func reserve() { openRequests += 1 }

    /// Takes room for `count` more bytes of an open request, or says there is none.
    func charge(_ count: Int) -> Bool {
        guard heldBytes + count <= Self.maxHeldBytes else { return false }
        heldBytes += count
        return true
    }

    func release(requests: Int, bytes: Int) {
        openRequests -= requests
        heldBytes -= bytes
    }

    func log(_ request: Request, response: Response, started: ContinuousClock.Instant) {
        server.log(request, status: response.dropConnection ? 0 : response.status.code, bytes: response.body.count, started: started, response: response)
    }

    func refused(_ request: Request, with response: Response, started: ContinuousClock.Instant) {
        log(request, response: response, started: started)
        responder.refused(request, with: response)
    }

    /// Runs `work` as a task; its answer comes back to the loop with the request's charge.
    func dispatch(_ work: @escaping @Sendable () async -> Response, connection: UInt64, stream: Int32, charge: Int) -> Task<Void, Never> {
        requestsInFlight.wrappingAdd(1, ordering: .relaxed)
        let task = Task { [self] in
            let response = await work()
            post(.answer(connection: connection, stream: stream, response, charge: charge))
        }
        // Started once the service is stopping (a held answer come due): cancelled too, as the stop cancelled the others.
        if stopDeadline != nil { task.cancel() }
        return task
    }

    /// Holds an answer for its delay on the server's alarms (one thread for every held answer), then carries it out here.
    func hold(_ next: @escaping @Sendable () -> PromptAnswer, after delay: Duration, connection: UInt64, stream: Int32, charge: Int) {
        let due: @Sendable () -> Void = { [self] in
            if !post(.due(connection: connection, stream: stream, next, charge: charge)) { return }
        }
        if server.isStopping {
            due()
            return
        }
        server.heldAnswers.schedule(after: delay, due)
    }
}

/// One HTTP/2 connection: its socket, its nghttp2 session, and its streams' requests.
final class HTTP2ServerConnection {
    /// A request on one stream, from its first header to its answer.
    final class Stream {
        var method = ""
        var path = ""
        var authority: String?
        var headers: [String: String] = [:]
        var headerBytes = 0
        var body = Data()
        var bodyLimit = Int.max
        var request: Request?
        var startedAt = ContinuousClock.now
        /// Bytes of the service's budget this request holds while it is here (handed to a task or a held answer with it).
        var charge = 0
        /// Whether the request still counts as open here (false once handed to a task or a held answer, or released).
        var counted = true
        /// The task answering it, cancelled if the stream or the connection ends first.
        var task: Task<Void, Never>?
        /// The answer's body and how much of it nghttp2 has taken; when the answer was submitted.
        var responseBody = Data()
        var responseOffset = 0
        var answeredAt: ContinuousClock.Instant?
        var isHead = false
        /// Whether the request is complete and handed to the responder (or refused): nothing more is read into it.
        var answered = false
    }

    let id: UInt64
    let socket: Int32
    let tunnel: String?
    unowned let service: HTTP2Service
    private var session: OpaquePointer?
    private(set) var streams: [Int32: Stream] = [:]
    var lastActivity = ContinuousClock.now
    /// When the socket last took bytes, or had none waiting: a client that stops reading is cut after the timeout.
    private(set) var lastWritten = ContinuousClock.now
    /// Whether bytes wait for the socket.
    var isBlocked: Bool { !outbox.isEmpty }
    /// When GOAWAY was sent (draining, idle): the connection is closed once nothing is open.
    private(set) var goAwaySince: ContinuousClock.Instant?
    /// Streams answered before their request's end (refusals): reset once the answer is out (RFC 9113 §8.1), so the
    /// client stops sending a body nobody reads.
    private var resetsDue: [Int32] = []
    /// Bytes nghttp2 produced that the socket did not take yet.
    private var outbox = HTTP2Outbox()

    init?(id: UInt64, socket: Int32, tunnel: String?, service: HTTP2Service) {
        self.id = id
        self.socket = socket
        self.tunnel = tunnel
        self.service = service
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return nil }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, serverBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, serverHeader)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, serverFrameReceived)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, serverDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, serverStreamClosed)
        var option: OpaquePointer?
        guard nghttp2_option_new(&option) == 0, let option else { return nil }
        defer { nghttp2_option_del(option) }
        nghttp2_option_set_max_send_header_block_length(option, 64 << 10)
        var made: OpaquePointer?
        guard nghttp2_session_server_new2(&made, callbacks, Unmanaged.passUnretained(self).toOpaque(), option) == 0, let made else { return nil }
        session = made
        var settings = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: HTTP2Service.maxConcurrentStreams),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: UInt32(HTTP2Service.streamWindow)),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: UInt32(HTTP2Service.maxHeaderBytes)),
        ]
        guard nghttp2_submit_settings(made, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count) == 0,
              nghttp2_session_set_local_window_size(made, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, HTTP2Service.connectionWindow) == 0 else {
            nghttp2_session_del(made)
            session = nil
            return nil
        }
    }

    deinit {
        if let session { nghttp2_session_del(session) }
    }

    /// Closes the socket and the session; every request still counted here is released, and its task cancelled.
    func closeSocket() {
        close(socket)
        if let session { nghttp2_session_del(session) }
        session = nil
        for stream in streams.values { forget(stream) }
        streams = [:]
    }

    /// Whether nghttp2 still wants to read or write (false after a fatal error or a terminated session).
    var isWanted: Bool {
        guard let session else { return false }
        return nghttp2_session_want_read(session) != 0 || nghttp2_session_want_write(session) != 0 || !outbox.isEmpty
    }

    func isOpen(_ streamID: Int32) -> Bool { streams[streamID] != nil }

    /// Feeds received bytes to the session; false when the connection must end.
    func receive(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let session else { return false }
        let used = nghttp2_session_mem_recv(session, bytes.baseAddress!.assumingMemoryBound(to: UInt8.self), bytes.count)
        return used >= 0
    }

    /// Writes what the session has to send until the socket would block; false when the connection must end.
    func send() -> Bool {
        guard let session else { return false }
        let outcome = outbox.flush(session, write: { bytes in
            let written = Glibc.send(socket, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL))
            if written > 0 { lastWritten = ContinuousClock.now }
            if written >= 0 { return .wrote(written) }
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? .wouldBlock : .failed
        }, whenIdle: { resetAnswered() })
        switch outcome {
        case .failed: return false
        case .drained:
            lastWritten = ContinuousClock.now
            return true
        case .blocked: return true
        }
    }

    /// GOAWAY with the last stream processed, once: the streams open go on, no new one is taken, and the connection
    /// is closed once nothing is open (the sweep, a second on, so the client reads the GOAWAY before the close).
    func goAway() {
        guard let session, goAwaySince == nil else { return }
        goAwaySince = ContinuousClock.now
        nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nghttp2_session_get_last_proc_stream_id(session),
                              NGHTTP2_NO_ERROR.rawValue, nil, 0)
    }

    /// Ends the session at once (the service stopping, or a client past a bound): GOAWAY, and nothing more is read.
    func terminate(_ code: nghttp2_error_code = NGHTTP2_NO_ERROR) {
        guard let session else { return }
        nghttp2_session_terminate_session(session, code.rawValue)
    }

    func cancelTasks() {
        for stream in streams.values { stream.task?.cancel() }
    }

    /// Resets requests still arriving past `arriving` since their first header, and answers the client has not taken
    /// within `unread` (a window it keeps closed).
    func resetOverdue(now: ContinuousClock.Instant, arriving: Duration, unread: Duration) {
        guard let session else { return }
        for (streamID, stream) in streams {
            let overdue = stream.answeredAt.map { now - $0 > unread } ?? (!stream.answered && now - stream.startedAt > arriving)
            if overdue { nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_CANCEL.rawValue) }
        }
    }

    /// Releases what a stream still holds of the service's budget and cancels its task.
    private func forget(_ stream: Stream) {
        stream.task?.cancel()
        guard stream.counted else { return }
        stream.counted = false
        service.release(requests: 1, bytes: stream.charge)
        stream.charge = 0
    }

    // MARK: Requests

    fileprivate func beginHeaders(_ streamID: Int32) {
        guard service.admitRequest() else {
            // No room in the service: refused unprocessed, which a client may send again.
            if let session { nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_REFUSED_STREAM.rawValue) }
            return
        }
        streams[streamID] = Stream()
    }

    /// One header field; false resets the stream (a header block past its bound, or the service's bytes used up).
    fileprivate func header(_ streamID: Int32, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        // A block after the request was answered or refused (trailers) is not kept, nor counted.
        guard let stream = streams[streamID], stream.counted, !stream.answered else { return true }
        let size = name.count + value.count + 32
        guard stream.headerBytes + size <= HTTP2Service.maxHeaderBytes, service.charge(size) else { return false }
        stream.headerBytes += size
        stream.charge += size
        let name = String(decoding: name, as: UTF8.self)
        let value = String(decoding: value, as: UTF8.self)
        switch name {
        case ":method": stream.method = value
        case ":path": stream.path = value
        case ":authority": stream.authority = value
        case ":scheme": break
        default:
            // Repeated fields are joined as HTTP/1.1 would (cookies with "; ").
            if let earlier = stream.headers[name] {
                stream.headers[name] = earlier + (name == "cookie" ? "; " : ", ") + value
            } else {
                stream.headers[name] = value
            }
        }
        return true
    }

    /// A request's header block is complete: admission, as HTTP/1.1 has it before the body.
    fileprivate func headersEnded(_ streamID: Int32, endsStream: Bool) {
        guard let stream = streams[streamID], stream.request == nil else { return }
        if stream.headers["host"] == nil, let authority = stream.authority { stream.headers["host"] = authority }
        var request = Request(method: HTTPMethod(rawValue: stream.method.isEmpty ? "GET" : stream.method),
                              target: HTTP2Path.decoded(stream.path.isEmpty ? "/" : stream.path), headers: stream.headers)
        request.tunnel = tunnel
        stream.headers = [:]
        stream.isHead = request.method == .head
        let declared = request.headers["content-length"].flatMap { Int($0) }
        var limit = service.maxBodySize
        var refusal: Response?
        switch service.responder.admit(RequestHead(request, contentLength: declared)) {
        case .refuse(let response): refusal = response
        case .accept(let bodyLimit): limit = min(limit, bodyLimit)
        }
        if refusal == nil, let declared, declared > limit { refusal = Self.tooLarge(limit) }
        stream.bodyLimit = limit
        stream.request = request
        if let refusal {
            refuse(streamID, stream, with: refusal)
        } else if endsStream {
            complete(streamID)
        }
    }

    fileprivate func dataChunk(_ streamID: Int32, _ bytes: UnsafeRawBufferPointer) {
        guard let stream = streams[streamID], !stream.answered, stream.request != nil else { return }
        guard stream.body.count + bytes.count <= stream.bodyLimit else {
            refuse(streamID, stream, with: Self.tooLarge(stream.bodyLimit))
            return
        }
        guard service.charge(bytes.count) else {
            if let session { nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_REFUSED_STREAM.rawValue) }
            return
        }
        stream.charge += bytes.count
        stream.body.append(bytes.assumingMemoryBound(to: UInt8.self))
    }

    /// The request's last frame arrived: to the responder (503 once the server is stopping, as HTTP/1.1 answers then).
    fileprivate func complete(_ streamID: Int32) {
        guard let stream = streams[streamID], !stream.answered, var request = stream.request else { return }
        stream.answered = true
        request.body = stream.body
        stream.body = Data()
        stream.request = request
        if service.isStopping {
            answer(streamID, with: HTTPServer.stoppingResponse)
            return
        }
        carryOut(service.responder.respondPromptly(to: request), stream: streamID)
    }

    /// A refusal is answered at once, and the rest of the request's body, if any, is not read (the stream is reset).
    private func refuse(_ streamID: Int32, _ stream: Stream, with response: Response) {
        stream.answered = true
        stream.body = Data()
        if let request = stream.request { service.refused(request, with: response, started: stream.startedAt) }
        submit(response, on: streamID, stream)
        resetsDue.append(streamID)
    }

    /// Resets the refused streams whose answer went out whole and whose client is still sending; true if any was.
    private func resetAnswered() -> Bool {
        guard let session, !resetsDue.isEmpty else { return false }
        var reset = false
        resetsDue.removeAll { streamID in
            guard streams[streamID] != nil else { return true }
            guard nghttp2_session_get_stream_local_close(session, streamID) == 1 else { return false }
            if nghttp2_session_get_stream_remote_close(session, streamID) == 0 {
                nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_NO_ERROR.rawValue)
                reset = true
            }
            return true
        }
        return reset
    }

    /// Carries out a responder's prompt answer. A task or a held answer takes the request's charge with it: what the
    /// request holds stays counted until its answer is back, even if the client resets the stream meanwhile.
    func carryOut(_ prompt: PromptAnswer, stream streamID: Int32) {
        guard let stream = streams[streamID] else { return }
        switch prompt {
        case .now(let response): answer(streamID, with: response)
        case .later(let work):
            let charge = handOver(stream)
            stream.task = service.dispatch(work, connection: id, stream: streamID, charge: charge)
        case .after(let delay, let next):
            service.hold(next, after: delay, connection: id, stream: streamID, charge: handOver(stream))
        }
    }

    /// The request's place in the service's budget, now carried by a task or a held answer (counted back when it is
    /// back: `admitRequest` for the held answer's next step starts from there).
    private func handOver(_ stream: Stream) -> Int {
        guard stream.counted else {
            // Counted out already (a held answer come due and holding again): it takes its place again, whatever the
            // bound (it was within it when it came, and its answer will count it out).
            service.reserve()
            return 0
        }
        stream.counted = false
        defer { stream.charge = 0 }
        return stream.charge
    }

    /// Sends a responder's answer on the stream, if the client has not reset it meanwhile.
    func answer(_ streamID: Int32, with response: Response) {
        guard let stream = streams[streamID], let request = stream.request else { return }
        stream.task = nil
        service.log(request, response: response, started: stream.startedAt)
        submit(response, on: streamID, stream)
    }

    private func submit(_ response: Response, on streamID: Int32, _ stream: Stream) {
        guard let session else { return }
        // What the request held is let go once it is answered.
        forget(stream)
        stream.answeredAt = ContinuousClock.now
        if response.dropConnection {
            // One stream of many: it is reset rather than the connection dropped (the client sees the call fail).
            nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), streamID, NGHTTP2_INTERNAL_ERROR.rawValue)
            return
        }
        var fields: [(String, String)] = [(":status", String(response.status.code))]
        for (name, value) in response.headers {
            let lowered = HTTPText.lowercasedName(name)
            if HTTP2Path.connectionSpecific.contains(lowered) || lowered == "content-length" { continue }
            fields.append((lowered, value))
        }
        fields.append(("content-length", String(response.body.count)))
        // A HEAD answer has its length and no body, as libmicrohttpd sends it.
        stream.responseBody = stream.isHead ? Data() : response.body
        stream.responseOffset = 0
        let hasBody = !stream.responseBody.isEmpty
        HTTP2Fields.withNameValues(fields) { nva in
            if hasBody {
                var provider = nghttp2_data_provider()
                provider.read_callback = serverReadBody
                _ = nghttp2_submit_response(session, streamID, nva.baseAddress, nva.count, &provider)
            } else {
                _ = nghttp2_submit_response(session, streamID, nva.baseAddress, nva.count, nil)
            }
        }
        if service.isDraining { goAway() }
    }

    fileprivate func readBody(_ streamID: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard let stream = streams[streamID] else {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            return 0
        }
        let remaining = stream.responseBody.count - stream.responseOffset
        let count = min(remaining, length)
        if count > 0 {
            stream.responseBody.withUnsafeBytes { bytes in
                buffer.update(from: bytes.baseAddress!.assumingMemoryBound(to: UInt8.self) + stream.responseOffset, count: count)
            }
        }
        stream.responseOffset += count
        if stream.responseOffset >= stream.responseBody.count { flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue }
        return count
    }

    fileprivate func streamClosed(_ streamID: Int32) {
        guard let stream = streams.removeValue(forKey: streamID) else { return }
        forget(stream)
    }

    static func tooLarge(_ limit: Int) -> Response {
        HTTPError(.payloadTooLarge, code: "payload_too_large", message: "The request body exceeds \(limit) bytes.").response
    }
}

/// What HTTP/2 changes of a request's text.
enum HTTP2Path {
    /// Fields HTTP/2 forbids (RFC 9113 §8.2.2): they describe an HTTP/1.1 connection.
    static let connectionSpecific: Set<String> = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"]

    /// The path decoded as libmicrohttpd decodes it for HTTP/1.1 (`shim_unescape_keeping_structure`): escapes decoded except
    /// those that would move a segment or the query (`%00`, `%2F`, `%3F`, `%23`, `%25`); the query is left to `Request`.
    static func decoded(_ target: String) -> String {
        let bytes = Array(target.utf8)
        let queryStart = bytes.firstIndex(of: UInt8(ascii: "?")) ?? bytes.count
        guard bytes[..<queryStart].contains(UInt8(ascii: "%")) else { return target }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var index = 0
        while index < queryStart {
            let byte = bytes[index]
            if byte == UInt8(ascii: "%"), index + 2 < queryStart, let high = hexValue(bytes[index + 1]), let low = hexValue(bytes[index + 2]) {
                let value = high << 4 | low
                if value != 0 && value != UInt8(ascii: "/") && value != UInt8(ascii: "?") && value != UInt8(ascii: "#") && value != UInt8(ascii: "%") {
                    out.append(value)
                    index += 3
                    continue
                }
            }
            out.append(byte)
            index += 1
        }
        out.append(contentsOf: bytes[queryStart...])
        return String(decoding: out, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

// MARK: - nghttp2's callbacks (user data: the connection, unretained; the connection outlives its session)

private func connection(_ userData: UnsafeMutableRawPointer?) -> HTTP2ServerConnection {
    Unmanaged<HTTP2ServerConnection>.fromOpaque(userData!).takeUnretainedValue()
}

private let serverBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, userData in
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue), frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST else { return 0 }
    connection(userData).beginHeaders(frame.pointee.hd.stream_id)
    return 0
}

private let serverHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
    let accepted = connection(userData).header(frame.pointee.hd.stream_id, name: UnsafeRawBufferPointer(start: name, count: nameLength),
                                               value: UnsafeRawBufferPointer(start: value, count: valueLength))
    return accepted ? 0 : Int32(NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue)
}

private let serverFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
    guard let frame else { return 0 }
    let streamID = frame.pointee.hd.stream_id
    let endsStream = frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
    switch Int(frame.pointee.hd.type) {
    case Int(NGHTTP2_HEADERS.rawValue):
        if frame.pointee.headers.cat == NGHTTP2_HCAT_REQUEST {
            connection(userData).headersEnded(streamID, endsStream: endsStream)
        } else if endsStream {
            connection(userData).complete(streamID)  // trailers end the request
        }
    case Int(NGHTTP2_DATA.rawValue):
        if endsStream { connection(userData).complete(streamID) }
    default: break
    }
    return 0
}

private let serverDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, streamID, data, length, userData in
    if let data { connection(userData).dataChunk(streamID, UnsafeRawBufferPointer(start: data, count: length)) }
    return 0
}

private let serverStreamClosed: nghttp2_on_stream_close_callback = { _, streamID, _, userData in
    connection(userData).streamClosed(streamID)
    return 0
}

private let serverReadBody: nghttp2_data_source_read_callback = { _, streamID, buffer, length, flags, _, userData in
    guard let buffer, let flags, let userData else { return 0 }
    return connection(userData).readBody(streamID, into: buffer, length: length, flags: flags)
}
