import CNGHTTP2
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
/// eventfd): a task's answer, a held answer come due, a socket from the front.
final class HTTP2Service: @unchecked Sendable {  // the loop's fields are touched only on its thread
    /// Concurrent streams one connection may open (SETTINGS_MAX_CONCURRENT_STREAMS); a client needing more opens
    /// another connection.
    static let maxConcurrentStreams: UInt32 = 4096
    /// Bytes of one request's header block (names and values) at most; past it the stream is reset.
    static let maxHeaderBytes = 64 << 10
    /// Request bodies held by one connection at most; past it the connection is ended (GOAWAY ENHANCE_YOUR_CALM).
    static let maxBufferedBytesPerConnection = 256 << 20
    /// Each stream's receive window (SETTINGS_INITIAL_WINDOW_SIZE) and the connection's.
    static let streamWindow: Int32 = 1 << 20
    static let connectionWindow: Int32 = 64 << 20

    enum Message {
        case adopt(Int32, tunnel: String?)
        case answer(connection: UInt64, stream: Int32, Response)
        case due(connection: UInt64, stream: Int32, @Sendable () -> PromptAnswer)
        case stop
    }

    /// Held strongly (the server keeps this service until its shutdown stops it).
    private let server: HTTPServer
    private let epoll: Int32
    private let wakeFD: Int32
    private let inbox = Locked<(messages: [Message], stopped: Bool)>(([], false))
    /// Requests whose answer is awaited (a task or a held answer), readable from any thread.
    let requestsInFlight = Atomic<Int>(0)
    /// Connections open now.
    let openConnections = Atomic<Int>(0)
    private var thread: Thread?
    private let finished = DispatchSemaphore(value: 0)

    // Owned by the loop thread.
    private var connections: [UInt64: HTTP2ServerConnection] = [:]
    private var nextID: UInt64 = 0
    private let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 256 << 10, alignment: 16)
    private var lastSweep = ContinuousClock.now

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
        self.thread = thread
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
        if !accepted, case .adopt(let socket, _) = message { close(socket) }
        if wake {
            var one: UInt64 = 1
            _ = write(wakeFD, &one, 8)
        }
        return accepted
    }

    /// Ends every connection (streams still open are reset) and waits for the loop to finish.
    func stop() {
        guard post(.stop) else { return }
        finished.wait()
    }

    // MARK: - The loop

    private func run() {
        var events = [epoll_event](repeating: epoll_event(), count: 256)
        while true {
            let count = epoll_wait(epoll, &events, Int32(events.count), 1000)
            if count > 0 {
                for index in 0..<Int(count) {
                    let id = events[index].data.u64
                    if id == 0 {
                        var value: UInt64 = 0
                        _ = read(wakeFD, &value, 8)
                    } else if let connection = connections[id] {
                        drive(connection, writable: events[index].events & EPOLLOUT.rawValue != 0)
                    }
                }
            }
            let messages = inbox.withLock { state in
                defer { state.messages.removeAll(keepingCapacity: true) }
                return state.messages
            }
            var touched: [UInt64: HTTP2ServerConnection] = [:]
            for message in messages {
                switch message {
                case .adopt(let socket, let tunnel): adopt(socket, tunnel: tunnel)
                case .answer(let id, let stream, let response):
                    requestsInFlight.wrappingSubtract(1, ordering: .relaxed)
                    guard let connection = connections[id] else { continue }
                    connection.answer(stream, with: response)
                    touched[id] = connection
                case .due(let id, let stream, let next):
                    requestsInFlight.wrappingSubtract(1, ordering: .relaxed)
                    guard let connection = connections[id] else { continue }
                    connection.carryOut(next(), stream: stream)
                    touched[id] = connection
                case .stop:
                    inbox.withLock { $0.stopped = true }
                    for connection in Array(connections.values) { end(connection) }
                    for message in inbox.withLock({ $0.messages }) { if case .adopt(let socket, _) = message { close(socket) } }
                    finished.signal()
                    return
                }
            }
            for connection in touched.values { flush(connection) }
            if ContinuousClock.now - lastSweep > .seconds(1) {
                lastSweep = ContinuousClock.now
                sweep()
            }
        }
    }

    private func adopt(_ socket: Int32, tunnel: String?) {
        guard connections.count < Int(server.configuration.connectionLimit) else {
            close(socket)
            return
        }
        nextID += 1
        guard let connection = HTTP2ServerConnection(id: nextID, socket: socket, tunnel: tunnel, service: self) else {
            close(socket)
            return
        }
        var event = epoll_event()
        event.events = EPOLLIN.rawValue | EPOLLOUT.rawValue | EPOLLRDHUP.rawValue | EPOLLET.rawValue
        event.data.u64 = connection.id
        guard epoll_ctl(epoll, EPOLL_CTL_ADD, socket, &event) == 0 else {
            connection.closeSocket()
            return
        }
        connections[connection.id] = connection
        openConnections.wrappingAdd(1, ordering: .relaxed)
        server.configuration.openConnections.value.wrappingAdd(1, ordering: .relaxed)
        drive(connection, writable: true)
    }

    /// Reads what arrived, feeds it to nghttp2, and writes what it has to send, until the socket would block.
    private func drive(_ connection: HTTP2ServerConnection, writable: Bool) {
        while true {
            let count = recv(connection.socket, readBuffer.baseAddress, readBuffer.count, 0)
            if count > 0 {
                connection.lastActivity = ContinuousClock.now
                guard connection.receive(UnsafeRawBufferPointer(rebasing: readBuffer[0..<count])) else {
                    end(connection)
                    return
                }
                if count < readBuffer.count { break }
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
        if !connection.send() || !connection.isWanted { end(connection) }
    }

    private func end(_ connection: HTTP2ServerConnection) {
        guard connections.removeValue(forKey: connection.id) != nil else { return }
        epoll_ctl(epoll, EPOLL_CTL_DEL, connection.socket, nil)
        connection.closeSocket()
        openConnections.wrappingSubtract(1, ordering: .relaxed)
        server.configuration.openConnections.value.wrappingSubtract(1, ordering: .relaxed)
    }

    /// Each second: connections silent for the server's connection timeout with no request waiting are closed.
    private func sweep() {
        let now = ContinuousClock.now
        let idle = Duration.seconds(Int(server.configuration.connectionTimeout))
        for connection in Array(connections.values) where connection.streams.isEmpty && now - connection.lastActivity > idle {
            connection.goAway(NGHTTP2_NO_ERROR)
            _ = connection.send()
            end(connection)
        }
    }

    // MARK: - What connections ask of the service

    var responder: any Responder { server.responder }
    var maxBodySize: Int { server.configuration.maxBodySize }
    var isDraining: Bool { server.isDraining }

    func log(_ request: Request, response: Response, started: ContinuousClock.Instant) {
        server.log(request, status: response.dropConnection ? 0 : response.status.code, bytes: response.body.count, started: started, response: response)
    }

    func refused(_ request: Request, with response: Response, started: ContinuousClock.Instant) {
        log(request, response: response, started: started)
        responder.refused(request, with: response)
    }

    /// Runs `work` as a task; its answer comes back to the loop.
    func dispatch(_ work: @escaping @Sendable () async -> Response, connection: UInt64, stream: Int32) {
        requestsInFlight.wrappingAdd(1, ordering: .relaxed)
        Task { [self] in
            let response = await work()
            if !post(.answer(connection: connection, stream: stream, response)) { requestsInFlight.wrappingSubtract(1, ordering: .relaxed) }
        }
    }

    /// Holds an answer for its delay on the server's alarms (one thread for every held answer), then carries it out here.
    func hold(_ next: @escaping @Sendable () -> PromptAnswer, after delay: Duration, connection: UInt64, stream: Int32) {
        requestsInFlight.wrappingAdd(1, ordering: .relaxed)
        let due: @Sendable () -> Void = { [self] in
            if !post(.due(connection: connection, stream: stream, next)) { requestsInFlight.wrappingSubtract(1, ordering: .relaxed) }
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
        var refusal: Response?
        var request: Request?
        var startedAt = ContinuousClock.now
        /// The answer's body and how much of it nghttp2 has taken.
        var responseBody = Data()
        var responseOffset = 0
        /// Whether the request is complete and handed to the responder (or refused): nothing more is read into it.
        var answered = false
    }

    let id: UInt64
    let socket: Int32
    let tunnel: String?
    unowned let service: HTTP2Service
    private var session: OpaquePointer?
    var streams: [Int32: Stream] = [:]
    var bufferedBytes = 0
    var lastActivity = ContinuousClock.now
    /// Streams answered before their request's end (refusals): reset once the answer is out (RFC 9113 §8.1), so the
    /// client stops sending a body nobody reads.
    private var resetsDue: [Int32] = []
    /// Bytes nghttp2 produced that the socket did not take yet.
    private var pending: [UInt8] = []
    private var pendingOffset = 0

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

    func closeSocket() {
        close(socket)
        if let session { nghttp2_session_del(session) }
        session = nil
        streams = [:]
    }

    /// Whether nghttp2 still wants to read or write (false after GOAWAY both ways, or a fatal error).
    var isWanted: Bool {
        guard let session else { return false }
        return nghttp2_session_want_read(session) != 0 || nghttp2_session_want_write(session) != 0 || pendingOffset < pending.count
    }

    /// Feeds received bytes to the session; false when the connection must end.
    func receive(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let session else { return false }
        let used = nghttp2_session_mem_recv(session, bytes.baseAddress!.assumingMemoryBound(to: UInt8.self), bytes.count)
        return used >= 0
    }

    /// Writes what the session has to send until the socket would block; false when the connection must end.
    func send() -> Bool {
        guard let session else { return false }
        while true {
            if pendingOffset < pending.count {
                let written = pending.withUnsafeBytes { bytes in
                    Glibc.send(socket, bytes.baseAddress! + pendingOffset, bytes.count - pendingOffset, Int32(MSG_NOSIGNAL))
                }
                if written < 0 { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR }
                pendingOffset += written
                if pendingOffset < pending.count { return true }
                pending.removeAll(keepingCapacity: pending.count <= 1 << 20)
                pendingOffset = 0
            }
            var data: UnsafePointer<UInt8>?
            let count = nghttp2_session_mem_send(session, &data)
            if count < 0 { return false }
            if count == 0 {
                if resetAnswered() { continue }
                return true
            }
            guard let data else { return false }
            let written = Glibc.send(socket, data, count, Int32(MSG_NOSIGNAL))
            if written < 0 && !(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) { return false }
            let taken = max(0, written)
            if taken < count {
                pending.append(contentsOf: UnsafeBufferPointer(start: data + taken, count: count - taken))
                return true
            }
        }
    }

    func goAway(_ code: nghttp2_error_code) {
        guard let session else { return }
        nghttp2_session_terminate_session(session, code.rawValue)
    }

    // MARK: Requests

    fileprivate func beginHeaders(_ streamID: Int32) {
        streams[streamID] = Stream()
    }

    /// One header field; false resets the stream (a header block past its bound).
    fileprivate func header(_ streamID: Int32, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) -> Bool {
        guard let stream = streams[streamID] else { return true }
        stream.headerBytes += name.count + value.count + 32
        guard stream.headerBytes <= HTTP2Service.maxHeaderBytes else { return false }
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
        let declared = request.headers["content-length"].flatMap { Int($0) }
        var limit = service.maxBodySize
        switch service.responder.admit(RequestHead(request, contentLength: declared)) {
        case .refuse(let response): stream.refusal = response
        case .accept(let bodyLimit): limit = min(limit, bodyLimit)
        }
        if stream.refusal == nil, let declared, declared > limit { stream.refusal = Self.tooLarge(limit) }
        stream.bodyLimit = limit
        stream.request = request
        if let refusal = stream.refusal {
            refuse(streamID, stream, with: refusal)
        } else if endsStream {
            complete(streamID)
        }
    }

    fileprivate func dataChunk(_ streamID: Int32, _ bytes: UnsafeRawBufferPointer) {
        guard let stream = streams[streamID], !stream.answered, stream.request != nil else { return }
        guard stream.body.count + bytes.count <= stream.bodyLimit else {
            bufferedBytes -= stream.body.count
            stream.body = Data()
            refuse(streamID, stream, with: Self.tooLarge(stream.bodyLimit))
            return
        }
        stream.body.append(bytes.assumingMemoryBound(to: UInt8.self))
        bufferedBytes += bytes.count
        if bufferedBytes > HTTP2Service.maxBufferedBytesPerConnection { goAway(NGHTTP2_ENHANCE_YOUR_CALM) }
    }

    /// The request's last frame arrived.
    fileprivate func complete(_ streamID: Int32) {
        guard let stream = streams[streamID], !stream.answered, var request = stream.request else { return }
        stream.answered = true
        bufferedBytes -= stream.body.count
        request.body = stream.body
        stream.body = Data()
        stream.request = request
        carryOut(service.responder.respondPromptly(to: request), stream: streamID)
    }

    /// A refusal is answered at once, and the rest of the request's body, if any, is not read (the stream is reset).
    private func refuse(_ streamID: Int32, _ stream: Stream, with response: Response) {
        stream.answered = true
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

    func carryOut(_ prompt: PromptAnswer, stream streamID: Int32) {
        switch prompt {
        case .now(let response): answer(streamID, with: response)
        case .later(let work): service.dispatch(work, connection: id, stream: streamID)
        case .after(let delay, let next): service.hold(next, after: delay, connection: id, stream: streamID)
        }
    }

    /// Sends a responder's answer on the stream, if the client has not reset it meanwhile.
    func answer(_ streamID: Int32, with response: Response) {
        guard let stream = streams[streamID], let request = stream.request else { return }
        service.log(request, response: response, started: stream.startedAt)
        submit(response, on: streamID, stream)
    }

    private func submit(_ response: Response, on streamID: Int32, _ stream: Stream) {
        guard let session else { return }
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
        stream.responseBody = response.body
        stream.responseOffset = 0
        let hasBody = !response.body.isEmpty
        HTTP2Fields.withNameValues(fields) { nva in
            if hasBody {
                var provider = nghttp2_data_provider()
                provider.read_callback = serverReadBody
                _ = nghttp2_submit_response(session, streamID, nva.baseAddress, nva.count, &provider)
            } else {
                _ = nghttp2_submit_response(session, streamID, nva.baseAddress, nva.count, nil)
            }
        }
        if service.isDraining { goAway(NGHTTP2_NO_ERROR) }
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
        if !stream.answered { bufferedBytes -= stream.body.count }
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

/// Header fields as nghttp2 takes them: pointers into one buffer, valid for the call only.
enum HTTP2Fields {
    static func withNameValues<Result>(_ fields: [(String, String)], _ body: (UnsafeMutableBufferPointer<nghttp2_nv>) -> Result) -> Result {
        var storage: [UInt8] = []
        var spans: [(Int, Int, Int, Int)] = []
        for (name, value) in fields {
            let nameStart = storage.count
            storage.append(contentsOf: name.utf8)
            let valueStart = storage.count
            storage.append(contentsOf: value.utf8)
            spans.append((nameStart, valueStart - nameStart, valueStart, storage.count - valueStart))
        }
        if storage.isEmpty { storage.append(0) }
        return storage.withUnsafeMutableBufferPointer { bytes in
            var nva = spans.map { span in
                // Copied by nghttp2 when the frame is submitted: the buffer lives for the call only.
                nghttp2_nv(name: bytes.baseAddress! + span.0, value: bytes.baseAddress! + span.2, namelen: span.1, valuelen: span.3,
                           flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            }
            return nva.withUnsafeMutableBufferPointer { body($0) }
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
