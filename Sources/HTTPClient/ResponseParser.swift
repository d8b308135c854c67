/// Parses one HTTP/1.x response from bytes as they arrive: status line, headers, then a body framed
/// by Content-Length, chunked transfer coding, or the end of the connection.
package struct ResponseParser: Sendable {
    enum State: Equatable, Sendable {
        case statusLine
        case headers
        case fixedBody(remaining: Int)
        case chunkSize
        case chunkData(remaining: Int)
        case chunkEnd
        case trailers
        case untilClose
        case done
    }

    private(set) var state = State.statusLine
    private(set) var status = 0
    private(set) var headers: [(name: String, value: String)] = []
    private(set) var body: [UInt8] = []
    /// Whether the connection may carry another request after this response.
    private(set) var keepAlive = true
    /// Whether any byte of the response arrived (a reused connection that closes before that may be retried).
    private(set) var sawBytes = false
    private var pending: [UInt8] = []
    private var version11 = true
    private let maxHeaderBytes = 64 << 10
    private let maxBodyBytes: Int

    package init(maxBodyBytes: Int = 64 << 20) {
        self.maxBodyBytes = maxBodyBytes
    }

    var isComplete: Bool { state == .done }

    /// Consumes `bytes`; returns true once the response is complete.
    package mutating func feed(_ bytes: UnsafeRawBufferPointer) throws(HTTPClientError) -> Bool {
        guard !bytes.isEmpty else { return isComplete }
        sawBytes = true
        pending.append(contentsOf: bytes)
        var offset = 0
        defer { pending.removeFirst(offset) }
        while state != .done {
            switch state {
            case .statusLine, .headers, .chunkSize, .chunkEnd, .trailers:
                guard let end = lineEnd(from: offset) else {
                    if pending.count - offset > maxHeaderBytes { throw malformed("header section too large") }
                    return false
                }
                let line = pending[offset..<end]
                offset = end + 2
                try consume(line: line)
            case .fixedBody(let remaining):
                let take = min(remaining, pending.count - offset)
                if take == 0 { return false }
                try append(pending[offset..<offset + take])
                offset += take
                state = remaining == take ? .done : .fixedBody(remaining: remaining - take)
            case .chunkData(let remaining):
                let take = min(remaining, pending.count - offset)
                if take == 0 { return false }
                try append(pending[offset..<offset + take])
                offset += take
                state = remaining == take ? .chunkEnd : .chunkData(remaining: remaining - take)
            case .untilClose:
                try append(pending[offset...])
                offset = pending.count
                return false
            case .done:
                break
            }
        }
        return true
    }

    /// The connection ended; returns true when that completes the response (a body framed by the close).
    package mutating func finishAtEndOfStream() -> Bool {
        if state == .untilClose {
            state = .done
            keepAlive = false
        }
        return isComplete
    }

    private func lineEnd(from offset: Int) -> Int? {
        var index = offset
        while index + 1 < pending.count {
            if pending[index] == 13 && pending[index + 1] == 10 { return index }
            index += 1
        }
        return nil
    }

    private mutating func append(_ bytes: ArraySlice<UInt8>) throws(HTTPClientError) {
        guard body.count + bytes.count <= maxBodyBytes else { throw malformed("body larger than \(maxBodyBytes) bytes") }
        body.append(contentsOf: bytes)
    }

    private mutating func consume(line: ArraySlice<UInt8>) throws(HTTPClientError) {
        switch state {
        case .statusLine:
            // "HTTP/1.1 200 OK"
            let text = String(decoding: line, as: UTF8.self)
            let parts = text.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: true)
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let code = Int(parts[1]), (100...999).contains(code) else {
                throw malformed("bad status line \"\(text.prefix(80))\"")
            }
            version11 = parts[0] == "HTTP/1.1"
            keepAlive = version11
            status = code
            state = .headers
        case .headers:
            if line.isEmpty {
                try startBody()
                return
            }
            guard let colon = line.firstIndex(of: UInt8(ascii: ":")) else { throw malformed("header line without a colon") }
            let name = String(decoding: line[line.startIndex..<colon], as: UTF8.self)
            let value = String(decoding: line[(colon + 1)...], as: UTF8.self).trimmingSpaces()
            headers.append((name, value))
        case .chunkSize:
            let text = String(decoding: line, as: UTF8.self)
            let digits = text.split(separator: ";", maxSplits: 1).first.map { String($0).trimmingSpaces() } ?? ""
            guard let size = Int(digits, radix: 16), size >= 0 else { throw malformed("bad chunk size \"\(text.prefix(20))\"") }
            state = size == 0 ? .trailers : .chunkData(remaining: size)
        case .chunkEnd:
            guard line.isEmpty else { throw malformed("chunk not followed by CRLF") }
            state = .chunkSize
        case .trailers:
            if line.isEmpty { state = .done }
        default:
            break
        }
    }

    private mutating func startBody() throws(HTTPClientError) {
        if (100...199).contains(status) {
            // An interim response (100 Continue): the real one follows.
            headers = []
            state = .statusLine
            return
        }
        if let connection = header("connection")?.lowercased() {
            if connection.contains("close") { keepAlive = false }
            if connection.contains("keep-alive") { keepAlive = true }
        }
        if status == 204 || status == 304 {
            state = .done
        } else if let coding = header("transfer-encoding"), coding.lowercased().contains("chunked") {
            state = .chunkSize
        } else if let length = header("content-length") {
            guard let count = Int(length), count >= 0 else { throw malformed("bad Content-Length \"\(length)\"") }
            guard count <= maxBodyBytes else { throw malformed("body larger than \(maxBodyBytes) bytes") }
            body.reserveCapacity(count)
            state = count == 0 ? .done : .fixedBody(remaining: count)
        } else {
            keepAlive = false
            state = .untilClose
        }
    }

    func header(_ name: String) -> String? {
        headers.first { $0.name.caseInsensitiveEquals(name) }?.value
    }

    private func malformed(_ message: String) -> HTTPClientError {
        HTTPClientError(.malformedResponse, "malformed HTTP response: \(message)")
    }
}

extension String {
    func trimmingSpaces() -> String {
        var scalars = Substring(self)
        while let first = scalars.first, first == " " || first == "\t" { scalars.removeFirst() }
        while let last = scalars.last, last == " " || last == "\t" { scalars.removeLast() }
        return String(scalars)
    }

    func caseInsensitiveEquals(_ other: String) -> Bool {
        utf8.count == other.utf8.count && lowercased() == other.lowercased()
    }
}
