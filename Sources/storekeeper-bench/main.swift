import CMicroHTTPD
import Foundation
import Glibc
import Synchronization

// Benchmark tools that must not cost the machine more than what they measure (the load generator shares two
// cores with the servers): `load` offers requests at a fixed rate (open loop), `bare` is the floor a
// libmicrohttpd handler sets on this machine. Not part of the product: `make bench` builds and runs it.

/// Prints to standard error and exits.
func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("storekeeper-bench: \(message)\n".utf8))
    exit(2)
}

/// `--name value` options of the command line.
struct Options {
    var values: [String: String] = [:]
    init(_ arguments: ArraySlice<String>) {
        var iterator = arguments.makeIterator()
        while let name = iterator.next() {
            guard name.hasPrefix("--") else { fail("unexpected argument \(name)") }
            values[String(name.dropFirst(2))] = iterator.next() ?? ""
        }
    }
    func string(_ name: String) -> String {
        guard let value = values[name] else { fail("--\(name) is required") }
        return value
    }
    func double(_ name: String, _ fallback: Double) -> Double {
        guard let text = values[name] else { return fallback }
        guard let value = Double(text) else { fail("--\(name) is a number") }
        return value
    }
}

// MARK: - Open-loop load

/// One request's fate: when it was meant to go, when its answer came (seconds from the start), its status.
struct Sample {
    var intended: Double
    var answered: Double
    var status: Int
}

/// A keep-alive HTTP/1.1 connection on a blocking socket: writes a request, reads one response. Per request it
/// allocates nothing and reads the answer's head as bytes: the generator shares the machine with what it measures.
final class Connection {
    let socket: Int32
    /// Bytes received and not yet consumed, from `start` to `end`.
    private var buffer = [UInt8](repeating: 0, count: 65_536)
    private var start = 0, end = 0

    init(host: String, port: UInt16) {
        socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        inet_pton(AF_INET, host, &address.sin_addr)
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else { fail("cannot connect to \(host):\(port): errno \(errno)") }
        var one: Int32 = 1
        setsockopt(socket, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    deinit { close(socket) }

    /// The request's head, rewritten in place for each body: its fixed lines, then the body's `Content-Length`.
    private var head: [UInt8] = []

    /// Sends `fixedHead`, a `Content-Length` line and `body` in one `writev` (no copy of the body) and returns the
    /// response's status (0 when the connection broke or the answer is not HTTP).
    func exchange(fixedHead: [UInt8], body: [UInt8]) -> Int {
        head.removeAll(keepingCapacity: true)
        head += fixedHead
        head += "Content-Length: \(body.count)\r\n\r\n".utf8
        guard sendAll(head, body) else { return 0 }
        while true {
            if let answer = Self.parse(buffer, from: start, to: end) {
                if end - start >= answer.length {
                    start += answer.length
                    if start == end { (start, end) = (0, 0) }
                    return answer.status
                }
                if answer.length > buffer.count {  // a body larger than the buffer: make room for it whole
                    buffer = Array(buffer[start..<end]) + [UInt8](repeating: 0, count: answer.length)
                    (start, end) = (0, end - start)
                }
            }
            if end == buffer.count {  // compact what is left to the front before reading more
                buffer.withUnsafeMutableBytes { raw in
                    _ = memmove(raw.baseAddress!, raw.baseAddress! + start, end - start)
                }
                (start, end) = (0, end - start)
                if end == buffer.count { buffer += [UInt8](repeating: 0, count: buffer.count) }
            }
            let count = buffer.withUnsafeMutableBytes { recv(socket, $0.baseAddress! + end, $0.count - end, 0) }
            if count <= 0 { return 0 }
            end += count
        }
    }

    private func sendAll(_ head: [UInt8], _ body: [UInt8]) -> Bool {
        var sent = 0
        let total = head.count + body.count
        while sent < total {
            let count = head.withUnsafeBytes { headBytes in
                body.withUnsafeBytes { bodyBytes -> Int in
                    withUnsafeTemporaryAllocation(of: iovec.self, capacity: 2) { parts -> Int in
                        var used = 0
                        if sent < head.count {
                            parts[used] = iovec(iov_base: UnsafeMutableRawPointer(mutating: headBytes.baseAddress! + sent), iov_len: head.count - sent)
                            used += 1
                        }
                        let bodySent = max(0, sent - head.count)
                        if bodySent < body.count {
                            parts[used] = iovec(iov_base: UnsafeMutableRawPointer(mutating: bodyBytes.baseAddress! + bodySent), iov_len: body.count - bodySent)
                            used += 1
                        }
                        return writev(socket, parts.baseAddress, Int32(used))
                    }
                }
            }
            if count <= 0 { return false }
            sent += count
        }
        return true
    }

    /// The status and whole length (head and body) of the answer starting at `from`, once its head has arrived.
    static func parse(_ bytes: [UInt8], from: Int, to: Int) -> (status: Int, length: Int)? {
        guard to - from >= 12 else { return nil }
        var index = from
        var headEnd: Int?
        while index + 3 < to {
            if bytes[index] == 13 && bytes[index + 1] == 10 && bytes[index + 2] == 13 && bytes[index + 3] == 10 {
                headEnd = index
                break
            }
            index += 1
        }
        guard let headEnd else { return nil }
        // "HTTP/1.1 200 ...": three digits after the first space.
        var status = 0
        if let space = bytes[from..<headEnd].firstIndex(of: 32), space + 3 < headEnd {
            for digit in bytes[(space + 1)...(space + 3)] where (48...57).contains(digit) { status = status * 10 + Int(digit - 48) }
        }
        var contentLength = 0
        let name = Array("content-length:".utf8)
        var line = from
        while line < headEnd {
            var lineEnd = line
            while lineEnd < headEnd && bytes[lineEnd] != 13 { lineEnd += 1 }
            if lineEnd - line > name.count && zip(bytes[line..<(line + name.count)], name).allSatisfy({ ($0 | 0x20) == $1 || $0 == $1 }) {
                for byte in bytes[(line + name.count)..<lineEnd] where (48...57).contains(byte) { contentLength = contentLength * 10 + Int(byte - 48) }
            }
            line = lineEnd + 2
        }
        return (status, headEnd + 4 - from + contentLength)
    }
}

func monotonic() -> Double {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return Double(time.tv_sec) + Double(time.tv_nsec) / 1e9
}

func percentile(_ sorted: [Double], _ fraction: Double) -> Double {
    sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int(Double(sorted.count) * fraction))]
}

/// `load --url http://127.0.0.1:P --path /v1/receipts --key K --bodies FILE --rate R --seconds S [--connections C]`:
/// request i is meant to leave at i / R seconds; each of C connections takes the next one due, waits for its
/// moment and sends it, so a slow server shows as latency from the intended moment (no coordinated omission)
/// up to C requests waiting at once. Every body is sent once. Prints one JSON line of figures. Several servers
/// (comma-separated URLs, processes sharing one database) share the connections in turn.
func load(_ options: Options) {
    let targets: [(host: String, port: Int)] = options.string("url").split(separator: ",").map { text in
        guard let url = URL(string: String(text)), let host = url.host, let port = url.port else { fail("--url is http://HOST:PORT[,…]") }
        return (host, port)
    }
    guard !targets.isEmpty else { fail("--url is http://HOST:PORT[,…]") }
    let path = options.values["path"] ?? "/v1/receipts"
    let key = options.string("key")
    let rate = options.double("rate", 1000)
    let seconds = options.double("seconds", 10)
    let connections = Int(options.double("connections", 64))
    // Only the bodies this run sends are read (a file for a long ladder of rates holds hundreds of megabytes).
    guard let file = fopen(options.string("bodies"), "r") else { fail("cannot read --bodies") }
    var read: [[UInt8]] = []
    var line: UnsafeMutablePointer<CChar>?
    var capacity = 0
    while read.count < Int(rate * seconds) {
        let length = getline(&line, &capacity, file)
        guard length > 0, let line else { break }
        // The line without its end (a body is one line of JSON: no CR or LF inside).
        var kept = length
        while kept > 0 && (line[kept - 1] == 10 || line[kept - 1] == 13) { kept -= 1 }
        if kept > 0 { read.append(Array(UnsafeRawBufferPointer(start: line, count: kept))) }
    }
    free(line)
    fclose(file)
    let bodies = read
    let total = min(bodies.count, Int(rate * seconds))
    guard total > 0 else { fail("no bodies") }
    if total < Int(rate * seconds) {
        FileHandle.standardError.write(Data("storekeeper-bench: only \(bodies.count) bodies for \(Int(rate * seconds)) requests; stopping at \(total)\n".utf8))
    }
    let heads = targets.map { Array("POST \(path) HTTP/1.1\r\nHost: \($0.host):\($0.port)\r\nAuthorization: Bearer \(key)\r\nContent-Type: application/json\r\n".utf8) }
    let next = Atomic<Int>(0)
    let results = Mutex<[Sample]>([])
    let start = monotonic() + 0.2
    let startUnix = Date().timeIntervalSince1970 + 0.2
    let done = DispatchGroup()
    for number in 0..<connections {
        done.enter()
        let target = targets[number % targets.count], head = heads[number % targets.count]
        Thread.detachNewThread {
            defer { done.leave() }
            let connection = Connection(host: target.host, port: UInt16(target.port))
            var samples: [Sample] = []
            while true {
                let index = next.wrappingAdd(1, ordering: .relaxed).oldValue
                guard index < total else { break }
                let intended = Double(index) / rate
                let wait = start + intended - monotonic()
                if wait > 0 { usleep(UInt32(wait * 1e6)) }
                let body = bodies[index]
                let status = connection.exchange(fixedHead: head, body: body)
                samples.append(Sample(intended: intended, answered: monotonic() - start, status: status))
            }
            results.withLock { $0 += samples }
        }
    }
    done.wait()
    let samples = results.withLock { $0 }
    let latencies = samples.map { $0.answered - $0.intended }.sorted()
    let accepted = samples.filter { (200..<300).contains($0.status) }.count
    let last = samples.map(\.answered).max() ?? 0
    let summary: [String: Any] = [
        "offered_per_second": rate, "requests": samples.count, "accepted": accepted, "refused": samples.count - accepted,
        "sent_per_second": Double(samples.count) / max(last, 1e-9), "seconds": last,
        "answer_p50_ms": percentile(latencies, 0.5) * 1000, "answer_p99_ms": percentile(latencies, 0.99) * 1000,
        "answer_max_ms": (latencies.last ?? 0) * 1000, "connections": connections, "start_unix": startUnix,
    ]
    let data = try! JSONSerialization.data(withJSONObject: summary, options: [.sortedKeys])
    print(String(decoding: data, as: UTF8.self))
}

// MARK: - Bare libmicrohttpd handler

/// The smallest useful handler: the same answer to every request, from a response made once.
nonisolated(unsafe) var bareResponse: OpaquePointer?

/// libmicrohttpd's access handler, a global function as C callbacks must be. Uploads are read and dropped.
func bareHandler(_ cls: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?, _ method: UnsafePointer<CChar>?,
                 _ version: UnsafePointer<CChar>?, _ data: UnsafePointer<CChar>?, _ size: UnsafeMutablePointer<Int>?,
                 _ state: UnsafeMutablePointer<UnsafeMutableRawPointer?>?) -> MHD_Result {
    if state?.pointee == nil {
        state?.pointee = UnsafeMutableRawPointer(bitPattern: 1)
        return .YES
    }
    if let size, size.pointee > 0 {
        size.pointee = 0
        return .YES
    }
    return MHD_queue_response(connection, 200, bareResponse)
}

/// `bare --port P [--threads N]`: answers `{"status":0}` to everything until killed; prints its URL.
func bare(_ options: Options) {
    let port = UInt16(options.double("port", 0))
    let threads = UInt32(options.double("threads", 2))
    let body = Array(#"{"status":0}"#.utf8)
    bareResponse = body.withUnsafeBytes { MHD_create_response_from_buffer(body.count, UnsafeMutableRawPointer(mutating: $0.baseAddress), .RESPMEM_MUST_COPY) }
    MHD_add_response_header(bareResponse, "Content-Type", "application/json")
    let flags = UInt32(MHD_USE_INTERNAL_POLLING_THREAD.rawValue | MHD_USE_EPOLL.rawValue)
    guard let daemon = shim_mhd_start(flags, port, "127.0.0.1", bareHandler, nil, nil, nil, nil, nil, 30, 16_384, threads, 0) else {
        fail("cannot start libmicrohttpd on port \(port)")
    }
    let bound = shim_mhd_bound_port(daemon)
    print("listening on http://127.0.0.1:\(bound)")
    fflush(nil)
    while true { sleep(3600) }
}

let arguments = CommandLine.arguments
switch arguments.dropFirst().first {
case "load": load(Options(arguments.dropFirst(2)))
case "bare": bare(Options(arguments.dropFirst(2)))
default: fail("usage: storekeeper-bench load|bare --option value …")
}
