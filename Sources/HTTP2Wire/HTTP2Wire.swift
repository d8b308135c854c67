import CNGHTTP2

/// What one write to a socket came to.
public enum HTTP2Write {
    case wrote(Int)
    case wouldBlock
    case failed
}

/// What flushing a session's output came to.
public enum HTTP2Flush: Equatable {
    /// The session has nothing more to send.
    case drained
    /// The socket took less than offered; the rest waits for it to be writable.
    case blocked
    /// The session or the socket failed: the connection must end.
    case failed(String)
}

/// The bytes an nghttp2 session has to send, and those the socket did not take yet (kept here until it does, since
/// `nghttp2_session_mem_send`'s buffer is valid only until its next call).
public struct HTTP2Outbox {
    private var pending: [UInt8] = []
    private var offset = 0

    public init() {}

    /// Whether bytes wait for the socket.
    public var isEmpty: Bool { offset >= pending.count }

    /// Writes what waits, then what the session produces, until `write` would block or the session has nothing more.
    /// `whenIdle` is asked once the session has nothing more: true if it queued more (which is then sent too).
    public mutating func flush(_ session: OpaquePointer, write: (UnsafeRawBufferPointer) -> HTTP2Write,
                               whenIdle: () -> Bool = { false }) -> HTTP2Flush {
        while true {
            if offset < pending.count {
                let step = pending.withUnsafeBytes { write(UnsafeRawBufferPointer(rebasing: $0[offset...])) }
                switch step {
                case .wrote(let count): offset += count
                case .wouldBlock: return .blocked
                case .failed: return .failed("connection closed while sending")
                }
                if offset < pending.count { continue }
                pending.removeAll(keepingCapacity: pending.count <= 1 << 20)
                offset = 0
            }
            var data: UnsafePointer<UInt8>?
            let count = nghttp2_session_mem_send(session, &data)
            if count < 0 { return .failed("HTTP/2: \(String(cString: nghttp2_strerror(Int32(count))))") }
            guard count > 0, let data else {
                if whenIdle() { continue }
                return .drained
            }
            var taken = 0
            switch write(UnsafeRawBufferPointer(start: data, count: count)) {
            case .wrote(let written): taken = written
            case .wouldBlock: break
            case .failed: return .failed("connection closed while sending")
            }
            if taken < count {
                pending.append(contentsOf: UnsafeRawBufferPointer(start: data + taken, count: count - taken))
                return .blocked
            }
        }
    }
}

/// Header fields as nghttp2 takes them: pointers into one buffer, valid for the call only (nghttp2 copies them when the
/// frame is submitted).
public enum HTTP2Fields {
    public static func withNameValues<Result>(_ fields: [(String, String)], _ body: (UnsafeMutableBufferPointer<nghttp2_nv>) -> Result) -> Result {
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
                nghttp2_nv(name: bytes.baseAddress! + span.0, value: bytes.baseAddress! + span.2, namelen: span.1, valuelen: span.3,
                           flags: UInt8(NGHTTP2_NV_FLAG_NONE.rawValue))
            }
            return nva.withUnsafeMutableBufferPointer { body($0) }
        }
    }
}
