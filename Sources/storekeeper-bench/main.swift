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

/// A keep-alive HTTP/1.1 connection on a blocking socket: writes a request, reads one response.
final class Connection {
    let socket: Int32
    private var buffer: [UInt8] = []

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

    /// Sends `request` and returns the response's status (0 when the connection broke).
    func exchange(_ request: [UInt8]) -> Int {
        var sent = 0
        while sent < request.count {
            let count = request.withUnsafeBytes { send(socket, $0.baseAddress! + sent, request.count - sent, Int32(MSG_NOSIGNAL)) }
            if count <= 0 { return 0 }
            sent += count
        }
        var chunk = [UInt8](repeating: 0, count: 65_536)
        while true {
            if let end = headEnd() {
                let head = String(decoding: buffer[..<end], as: UTF8.self)
                let length = head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                    .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
                if buffer.count >= end + 4 + length {
                    let status = Int(head.split(separator: " ").dropFirst().first ?? "") ?? 0
                    buffer.removeFirst(end + 4 + length)
                    return status
                }
            }
            let count = recv(socket, &chunk, chunk.count, 0)
            if count <= 0 { return 0 }
            buffer.append(contentsOf: chunk[..<count])
        }
    }

    private func headEnd() -> Int? {
        guard buffer.count >= 4 else { return nil }
        for index in 0...(buffer.count - 4) where buffer[index] == 13 && buffer[index + 1] == 10 && buffer[index + 2] == 13 && buffer[index + 3] == 10 {
            return index
        }
        return nil
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
        let bytes = UnsafeRawBufferPointer(start: line, count: length).filter { $0 != 10 && $0 != 13 }
        if !bytes.isEmpty { read.append(bytes) }
    }
    free(line)
    fclose(file)
    let bodies = read
    let total = min(bodies.count, Int(rate * seconds))
    guard total > 0 else { fail("no bodies") }
    if total < Int(rate * seconds) {
        FileHandle.standardError.write(Data("storekeeper-bench: only \(bodies.count) bodies for \(Int(rate * seconds)) requests; stopping at \(total)\n".utf8))
    }
    let heads = targets.map { "POST \(path) HTTP/1.1\r\nHost: \($0.host):\($0.port)\r\nAuthorization: Bearer \(key)\r\nContent-Type: application/json\r\n" }
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
                let status = connection.exchange(Array((head + "Content-Length: \(body.count)\r\n\r\n").utf8) + body)
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
