import CSystem
import Foundation
import Locking
import Synchronization

/// Accepts connections in front of libmicrohttpd and sorts them by their first byte:
///
/// - a TLS handshake (`0x16`) is terminated here (a client that reached us through a hosts entry);
/// - `C` may be `CONNECT host:443`: for a host the TLS context serves, the proxy answers 200 and terminates
///   the TLS inside the tunnel; any other host is refused (this is not an open proxy);
/// - `PRI` begins HTTP/2's connection preface (cleartext, prior knowledge): the connection goes to the HTTP/2 service;
/// - anything else is plain HTTP and goes to libmicrohttpd untouched.
///
/// Terminated TLS reaches libmicrohttpd as plaintext over a socket pair, so every request, whichever way it
/// came, is served by the same responder. One thread accepts and sorts; each tunnel has its own thread,
/// at most `tunnelLimit` at once.
final class ConnectionFront: @unchecked Sendable {
    /// Hands a connection's socket to libmicrohttpd, which owns (and closes) it from then on. `tunnel` is the
    /// host name a terminated TLS connection asked for (nil for plain HTTP), so requests on it can be told apart.
    typealias HandOff = @Sendable (_ socket: Int32, _ peer: sockaddr_in, _ tunnel: String?) -> Void

    private let listeners: [Int32]
    private let tls: TLSServerContext
    private let handOff: HandOff
    /// Takes a connection that began with HTTP/2's preface.
    private let handOffHTTP2: @Sendable (_ socket: Int32) -> Void
    private let tunnelLimit: Int
    /// A connection that sends nothing for this long before its first byte is closed.
    private let firstByteTimeout: Double = 10
    private let wake: (read: Int32, write: Int32)
    private let tunnels = Locked(0)
    /// Times a waiting connection's first bytes were looked at (read by tests: a connection that sent too little to
    /// tell is looked at every 10 ms, not in a spin).
    let peeks = Atomic<Int>(0)
    private let stopped = Locked(false)
    private var thread: Thread?

    /// The ports bound, in the order asked.
    let ports: [UInt16]

    struct BindError: Error, CustomStringConvertible {
        let description: String
    }

    init(host: String, ports: [UInt16], tls: TLSServerContext, tunnelLimit: Int = HTTPServer.tunnelLimit, handOff: @escaping HandOff,
         handOffHTTP2: @escaping @Sendable (_ socket: Int32) -> Void) throws(BindError) {
        var listeners: [Int32] = []
        var bound: [UInt16] = []
        do {
            for port in ports {
                let (socket, actual) = try Self.listen(host: host, port: port)
                listeners.append(socket)
                bound.append(actual)
            }
        } catch {
            for socket in listeners { close(socket) }
            throw error
        }
        var pipeEnds: [Int32] = [0, 0]
        guard pipe(&pipeEnds) == 0 else {
            for socket in listeners { close(socket) }
            throw BindError(description: "pipe: \(String(cString: strerror(errno)))")
        }
        self.listeners = listeners
        self.ports = bound
        self.tls = tls
        self.handOff = handOff
        self.handOffHTTP2 = handOffHTTP2
        self.tunnelLimit = tunnelLimit
        wake = (pipeEnds[0], pipeEnds[1])
    }

    deinit {
        close(wake.read)
        close(wake.write)
    }

    func start() {
        signal(SIGPIPE, SIG_IGN)  // OpenSSL writes with write(2); a client that went away must not end the process
        let thread = Thread { [self] in acceptLoop() }
        thread.name = "storekeeper-front"
        thread.start()
        self.thread = thread
    }

    /// Stops accepting and closes the listening sockets; tunnels end with their connections.
    func stop() {
        guard stopped.withLock({ stopped in
            defer { stopped = true }
            return !stopped
        }) else { return }
        var byte: UInt8 = 1
        _ = write(wake.write, &byte, 1)
    }

    // MARK: - Accepting and sorting

    private struct Waiting {
        let socket: Int32
        let peer: sockaddr_in
        let deadline: Double
        /// Set when the first bytes arrived but not enough to tell (`P`, `PR`): looked at again then, not polled (the
        /// socket stays readable, and polling it would spin).
        var peekAgainAt: Double?
    }

    /// What sorting a connection came to.
    private enum Sorted { case done, nothingYet, tooLittle }

    private func acceptLoop() {
        var waiting: [Waiting] = []
        // Out of file descriptors, a listener stays readable: it is left out of the poll set for a moment.
        var listenersPausedUntil = 0.0
        defer {
            for socket in listeners { close(socket) }
            for entry in waiting { close(entry.socket) }
        }
        while !stopped.withLock({ $0 }) {
            let now = Self.now()
            let paused = now < listenersPausedUntil
            var fds = [pollfd(fd: wake.read, events: Int16(POLLIN), revents: 0)]
            fds += listeners.map { pollfd(fd: paused ? -1 : $0, events: Int16(POLLIN), revents: 0) }
            fds += waiting.map { pollfd(fd: $0.peekAgainAt == nil ? $0.socket : -1, events: Int16(POLLIN), revents: 0) }
            var wakeAt = waiting.map { min($0.deadline, $0.peekAgainAt ?? .infinity) }.min()
            if paused { wakeAt = min(wakeAt ?? listenersPausedUntil, listenersPausedUntil) }
            let soonest = wakeAt.map { max(0, Int32(($0 - now) * 1000) + 1) } ?? -1
            let ready = poll(&fds, nfds_t(fds.count), soonest)
            if ready < 0 && errno != EINTR { return }
            if fds[0].revents != 0 { return }
            for (index, socket) in listeners.enumerated() where fds[1 + index].revents != 0 {
                if !acceptAll(from: socket, into: &waiting) { listenersPausedUntil = Self.now() + 0.1 }
            }
            let base = 1 + listeners.count
            let checkedAt = Self.now()
            var still: [Waiting] = []
            for (index, var entry) in waiting.enumerated() {
                let events = index + base < fds.count ? fds[index + base].revents : 0
                if events != 0 || entry.deadline <= checkedAt || (entry.peekAgainAt ?? .infinity) <= checkedAt {
                    switch sort(entry) {
                    case .done: break
                    case .nothingYet:
                        entry.peekAgainAt = nil
                        still.append(entry)
                    case .tooLittle:
                        entry.peekAgainAt = checkedAt + 0.01
                        still.append(entry)
                    }
                } else {
                    still.append(entry)
                }
            }
            waiting = still
        }
    }

    /// Accepts every pending connection; false when the process is out of file descriptors.
    private func acceptAll(from listener: Int32, into waiting: inout [Waiting]) -> Bool {
        while true {
            var address = sockaddr_in()
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            let socket = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { accept(listener, $0, &length) }
            }
            guard socket >= 0 else { return errno != EMFILE && errno != ENFILE && errno != ENOBUFS && errno != ENOMEM }
            _ = fcntl(socket, F_SETFD, FD_CLOEXEC)
            _ = fcntl(socket, F_SETFL, fcntl(socket, F_GETFL) | O_NONBLOCK)
            var entry = Waiting(socket: socket, peer: address, deadline: Self.now() + firstByteTimeout)
            // Most clients send at once; only the silent ones wait in the poll set (bounded like libmicrohttpd's own limit).
            let sorted = sort(entry)
            if sorted != .done {
                if sorted == .tooLittle { entry.peekAgainAt = Self.now() + 0.01 }
                if waiting.count >= 4096 { close(socket) } else { waiting.append(entry) }
            }
        }
    }

    /// Routes a connection by its first bytes, unless nothing (or too little to tell) has arrived yet; past its
    /// deadline a connection is routed (or closed) with what it sent.
    private func sort(_ entry: Waiting) -> Sorted {
        peeks.add(1, ordering: .relaxed)
        var first: (UInt8, UInt8, UInt8) = (0, 0, 0)
        let count = withUnsafeMutableBytes(of: &first) { recv(entry.socket, $0.baseAddress, 3, Int32(MSG_PEEK | MSG_DONTWAIT)) }
        let due = entry.deadline <= Self.now()
        if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && !due { return .nothingYet }
        guard count >= 1 else {
            close(entry.socket)
            return .done
        }
        // `P` is POST, PUT, PATCH or HTTP/2's `PRI`: the third byte tells (the first segment of a request usually comes
        // whole). Waited for one second at most: then what came is sorted as HTTP/1.1.
        let waitedLong = Self.now() - (entry.deadline - firstByteTimeout) > 1
        if first.0 == UInt8(ascii: "P") && count < 3 && !due && !waitedLong { return .tooLittle }
        switch first.0 {
        case 0x16: startTunnel(entry, kind: .direct)
        case UInt8(ascii: "C"): startTunnel(entry, kind: .proxy)
        case UInt8(ascii: "P") where count == 3 && first.1 == UInt8(ascii: "R") && first.2 == UInt8(ascii: "I"): handOffHTTP2(entry.socket)
        default: handOff(entry.socket, entry.peer, nil)
        }
        return .done
    }

    private func startTunnel(_ entry: Waiting, kind: TLSTunnel.Kind) {
        let admitted = tunnels.withLock { count -> Bool in
            guard count < tunnelLimit else { return false }
            count += 1
            return true
        }
        guard admitted else {
            if kind == .proxy { TLSTunnel.reply(entry.socket, status: "503 Service Unavailable", message: "Too many tunnels at once; try again.") }
            close(entry.socket)
            return
        }
        let tunnel = TLSTunnel(socket: entry.socket, peer: entry.peer, kind: kind, tls: tls, handOff: handOff)
        let thread = Thread { [self] in
            tunnel.run()
            tunnels.withLock { $0 -= 1 }
        }
        thread.name = "storekeeper-tunnel"
        thread.stackSize = 256 << 10
        thread.start()
    }

    // MARK: - Sockets

    private static func listen(host: String, port: UInt16) throws(BindError) -> (Int32, UInt16) {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else { throw BindError(description: "\(host) is not an IPv4 address") }
        let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard socket >= 0 else { throw BindError(description: "socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        // Connections that send nothing for ten seconds are not handed to accept: silence costs no slot here.
        var seconds: Int32 = 10
        setsockopt(socket, Int32(IPPROTO_TCP), TCP_DEFER_ACCEPT, &seconds, socklen_t(MemoryLayout<Int32>.size))
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, Glibc.listen(socket, 1024) == 0 else {
            let reason = String(cString: strerror(errno))
            close(socket)
            throw BindError(description: "cannot listen on \(host):\(port) (\(reason))")
        }
        var actual = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &actual) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(socket, $0, &length) }
        }
        return (socket, UInt16(bigEndian: actual.sin_port))
    }

    static func now() -> Double {
        var spec = timespec()
        clock_gettime(CLOCK_MONOTONIC, &spec)
        return Double(spec.tv_sec) + Double(spec.tv_nsec) / 1e9
    }
}
