import CNGHTTP2
import HTTP2Wire
import Clocks
import Foundation

/// One HTTP/2 connection's client side (nghttp2 does the framing, HPACK and flow control): the requests on its streams,
/// and the bytes it has to send. Used only on the event-loop thread, which owns the socket and feeds this what it reads.
final class HTTP2ClientSession {
    /// A request on one stream and its answer so far.
    final class Call {
        let request: PendingRequest
        var status = 0
        var headers: [(name: String, value: String)] = []
        var body: [UInt8] = []
        /// How much of the request's body nghttp2 has taken.
        var bodySent = 0
        var tooLarge = false

        init(request: PendingRequest) { self.request = request }
    }

    /// Streams a connection carries before the server's SETTINGS say how many it allows (RFC 9113 §6.5.2's advice).
    static let assumedConcurrentStreams = 100

    private var session: OpaquePointer?
    private(set) var calls: [Int32: Call] = [:]
    /// The stream of each request on this connection.
    private(set) var streamOf: [UInt64: Int32] = [:]
    /// Whether the server's SETTINGS arrived: it speaks HTTP/2 (until then a cleartext server may be HTTP/1.1 only).
    private(set) var confirmed = false
    /// Calls that ended, for the event loop to finish (and forget) after a feed or a send.
    private(set) var ended: [(Call, Result<HTTPClientResponse, HTTPClientError>)] = []
    /// Calls the server refused unprocessed (REFUSED_STREAM, or above the last stream of its GOAWAY): safe to send again.
    private(set) var refused: [PendingRequest] = []
    /// Whether any byte arrived, and whether the first ones were an HTTP/1 status line: a server that does not speak
    /// HTTP/2 answers the preface that way, having read no request.
    private(set) var receivedAny = false
    private(set) var answeredAsHTTP1 = false
    /// The first bytes that arrived, up to the length of `HTTP/1.` (a first read may bring fewer).
    private var firstBytes: [UInt8] = []
    private var outbox = HTTP2Outbox()
    private let maxResponseBytes: Int

    init?(maxResponseBytes: Int) {
        self.maxResponseBytes = maxResponseBytes
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else { return nil }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_header_callback(callbacks, clientHeader)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, clientFrameReceived)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, clientDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, clientStreamClosed)
        var made: OpaquePointer?
        guard nghttp2_session_client_new(&made, callbacks, Unmanaged.passUnretained(self).toOpaque()) == 0, let made else { return nil }
        session = made
        // Answers are small and many: a wide window per stream and for the connection, so none waits for a WINDOW_UPDATE.
        var settings = [
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: 1 << 20),
        ]
        guard nghttp2_submit_settings(made, UInt8(NGHTTP2_FLAG_NONE.rawValue), &settings, settings.count) == 0,
              nghttp2_session_set_local_window_size(made, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, 64 << 20) == 0 else {
            nghttp2_session_del(made)
            session = nil
            return nil
        }
    }

    deinit {
        if let session { nghttp2_session_del(session) }
    }

    /// Streams open or queued now.
    var active: Int { calls.count }

    /// How many streams the server allows at once (what it said, or the assumption until it does).
    var streamLimit: Int {
        guard let session, confirmed else { return Self.assumedConcurrentStreams }
        return Int(min(nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS), 1 << 20))
    }

    /// Whether the connection may take another request: open both ways, no GOAWAY, a stream free.
    var hasRoom: Bool {
        guard let session else { return false }
        return nghttp2_session_want_read(session) != 0 && nghttp2_session_check_request_allowed(session) != 0 && active < streamLimit
    }

    /// Whether nghttp2 still wants the connection (false after GOAWAY both ways with no stream left, or a fatal error).
    var isWanted: Bool {
        guard let session else { return false }
        return nghttp2_session_want_read(session) != 0 || nghttp2_session_want_write(session) != 0 || !outbox.isEmpty
    }

    /// Opens a stream for `request`; false if nghttp2 refused it (the connection is going away).
    func submit(_ request: PendingRequest) -> Bool {
        guard let session, let fields = request.http2Fields else { return false }
        let call = Call(request: request)
        let hasBody = request.bytes.count > request.bodyStart
        let stream = HTTP2Fields.withNameValues(fields) { nva -> Int32 in
            if hasBody {
                var provider = nghttp2_data_provider()
                provider.read_callback = clientReadBody
                return nghttp2_submit_request(session, nil, nva.baseAddress, nva.count, &provider, nil)
            }
            return nghttp2_submit_request(session, nil, nva.baseAddress, nva.count, nil, nil)
        }
        guard stream > 0 else { return false }
        calls[stream] = call
        streamOf[request.id] = stream
        return true
    }

    /// Ends a request's stream (a deadline passed or the caller cancelled); the call is forgotten at once.
    func reset(_ requestID: UInt64) -> PendingRequest? {
        guard let stream = streamOf.removeValue(forKey: requestID), let call = calls.removeValue(forKey: stream) else { return nil }
        if let session { nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream, NGHTTP2_CANCEL.rawValue) }
        return call.request
    }

    /// Takes every call still open (the connection is closing), forgetting them.
    func takeAll() -> [PendingRequest] {
        defer {
            calls = [:]
            streamOf = [:]
        }
        return calls.keys.sorted().compactMap { calls[$0]?.request }
    }

    /// The request on this connection with that id, if its stream is open.
    func request(_ id: UInt64) -> PendingRequest? { streamOf[id].flatMap { calls[$0]?.request } }

    /// Requests whose body went out whole since the last time (for letting their bytes go later).
    private(set) var justSent: [PendingRequest] = []

    func takeJustSent() -> [PendingRequest] {
        defer { justSent.removeAll(keepingCapacity: true) }
        return justSent
    }

    /// Takes the calls the server refused unprocessed since the last time.
    func takeRefused() -> [PendingRequest] {
        defer { refused.removeAll(keepingCapacity: true) }
        return refused
    }

    /// Takes the calls that ended since the last time.
    func takeEnded() -> [(Call, Result<HTTPClientResponse, HTTPClientError>)] {
        defer { ended.removeAll(keepingCapacity: true) }
        return ended
    }

    /// Looks at bytes read from a connection that is ending (not fed to nghttp2): what the server answered, if anything.
    func noteLast(_ bytes: UnsafeRawBufferPointer) { note(bytes) }

    /// Keeps the first seven bytes and tells from them whether the server answered as HTTP/1.
    private func note(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        receivedAny = true
        guard firstBytes.count < 7 else { return }
        firstBytes += bytes.prefix(7 - firstBytes.count)
        answeredAsHTTP1 = firstBytes.count == 7 && firstBytes.elementsEqual("HTTP/1.".utf8)
    }

    /// Feeds bytes read from the socket; an error when the connection must end.
    func receive(_ bytes: UnsafeRawBufferPointer) -> HTTPClientError? {
        guard let session else { return HTTPClientError(.connectionClosed, "HTTP/2 session ended") }
        note(bytes)
        let used = nghttp2_session_mem_recv(session, bytes.baseAddress!.assumingMemoryBound(to: UInt8.self), bytes.count)
        guard used >= 0 else { return HTTPClientError(.malformedResponse, "HTTP/2: \(String(cString: nghttp2_strerror(Int32(used))))") }
        return nil
    }

    /// Writes what the session has to send through `write` until it would block; an error when the connection must end.
    func send(_ write: (UnsafeRawBufferPointer) -> IOStep) -> HTTPClientError? {
        guard let session else { return HTTPClientError(.connectionClosed, "HTTP/2 session ended") }
        var failure: HTTPClientError?
        let outcome = outbox.flush(session) { bytes in
            switch write(bytes) {
            case .done(let count): return .wrote(count)
            case .wouldBlock: return .wouldBlock
            case .closed: return .failed
            case .failed(let error):
                failure = error
                return .failed
            }
        }
        if case .failed(let reason) = outcome { return failure ?? HTTPClientError(.connectionClosed, reason) }
        return nil
    }

    // MARK: What nghttp2 tells

    fileprivate func header(_ stream: Int32, name: UnsafeRawBufferPointer, value: UnsafeRawBufferPointer) {
        guard let call = calls[stream] else { return }
        let name = String(decoding: name, as: UTF8.self)
        let value = String(decoding: value, as: UTF8.self)
        if name == ":status" {
            // An interim answer (1xx) is followed by the real one: what it carried is dropped.
            call.status = Int(value) ?? 0
            call.headers = []
        } else if call.headers.count < 256 {
            call.headers.append((name, value))
        }
    }

    fileprivate func settingsArrived() { confirmed = true }

    fileprivate func dataChunk(_ stream: Int32, _ bytes: UnsafeRawBufferPointer) {
        guard let call = calls[stream], !call.tooLarge else { return }
        guard call.body.count + bytes.count <= maxResponseBytes else {
            call.tooLarge = true
            call.body = []
            if let session { nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream, NGHTTP2_CANCEL.rawValue) }
            return
        }
        call.body.append(contentsOf: bytes)
    }

    fileprivate func streamClosed(_ stream: Int32, errorCode: UInt32) {
        guard let call = calls.removeValue(forKey: stream) else { return }
        streamOf[call.request.id] = nil
        let result: Result<HTTPClientResponse, HTTPClientError>
        if errorCode == NGHTTP2_REFUSED_STREAM.rawValue && !call.request.isAnswered {
            refused.append(call.request)
            return
        }
        if call.tooLarge {
            result = .failure(HTTPClientError(.malformedResponse, "response body larger than \(maxResponseBytes) bytes"))
        } else if call.status >= 200 && call.request.isAnswered {
            // Complete only with the stream's end: a reset after part of the answer (even NO_ERROR) leaves it cut short.
            result = .success(HTTPClientResponse(status: call.status, headers: call.headers, body: call.body))
        } else {
            result = .failure(HTTPClientError(.connectionClosed, "HTTP/2 stream reset (\(String(cString: nghttp2_http2_strerror(errorCode))))"))
        }
        ended.append((call, result))
    }

    fileprivate func streamAnswered(_ stream: Int32) { calls[stream]?.request.isAnswered = true }

    fileprivate func readBody(_ stream: Int32, into buffer: UnsafeMutablePointer<UInt8>, length: Int, flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard let call = calls[stream] else {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            return 0
        }
        let bytes = call.request.bytes
        let start = call.request.bodyStart + call.bodySent
        let count = max(0, min(length, bytes.count - start))
        if count > 0 {
            bytes.withUnsafeBytes { source in
                buffer.update(from: source.baseAddress!.assumingMemoryBound(to: UInt8.self) + start, count: count)
            }
        }
        call.bodySent += count
        if start + count >= bytes.count {
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            call.request.sentAt = Monotonic.now
            justSent.append(call.request)
        }
        return count
    }
}

// MARK: - nghttp2's callbacks (user data: the session object, unretained; it outlives its nghttp2 session)

private func owner(_ userData: UnsafeMutableRawPointer?) -> HTTP2ClientSession {
    Unmanaged<HTTP2ClientSession>.fromOpaque(userData!).takeUnretainedValue()
}

private let clientHeader: nghttp2_on_header_callback = { _, frame, name, nameLength, value, valueLength, _, userData in
    guard let frame, frame.pointee.hd.type == UInt8(NGHTTP2_HEADERS.rawValue) else { return 0 }
    owner(userData).header(frame.pointee.hd.stream_id, name: UnsafeRawBufferPointer(start: name, count: nameLength),
                           value: UnsafeRawBufferPointer(start: value, count: valueLength))
    return 0
}

private let clientFrameReceived: nghttp2_on_frame_recv_callback = { _, frame, userData in
    guard let frame else { return 0 }
    switch Int(frame.pointee.hd.type) {
    case Int(NGHTTP2_SETTINGS.rawValue): owner(userData).settingsArrived()
    case Int(NGHTTP2_HEADERS.rawValue), Int(NGHTTP2_DATA.rawValue):
        if frame.pointee.hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0 { owner(userData).streamAnswered(frame.pointee.hd.stream_id) }
    default: break
    }
    return 0
}

private let clientDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, stream, data, length, userData in
    if let data { owner(userData).dataChunk(stream, UnsafeRawBufferPointer(start: data, count: length)) }
    return 0
}

private let clientStreamClosed: nghttp2_on_stream_close_callback = { _, stream, errorCode, userData in
    owner(userData).streamClosed(stream, errorCode: errorCode)
    return 0
}

private let clientReadBody: nghttp2_data_source_read_callback = { _, stream, buffer, length, flags, _, userData in
    guard let buffer, let flags, let userData else { return 0 }
    return owner(userData).readBody(stream, into: buffer, length: length, flags: flags)
}
