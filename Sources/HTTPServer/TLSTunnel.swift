import COpenSSL
import CSystem
import Foundation

/// One intercepted connection, on its own thread: reads a `CONNECT` request (proxy kind), terminates TLS,
/// and pumps plaintext between the TLS session and a socket pair whose other end libmicrohttpd serves.
/// Every socket is non-blocking; every wait is a `poll` with a deadline, so no peer can hold the thread for ever.
// Used by the one thread that runs it.
final class TLSTunnel: @unchecked Sendable {
    enum Kind {
        /// The client sent `CONNECT` first (`HTTPS_PROXY`).
        case proxy
        /// The client started TLS at once (a hosts entry pointing Apple's names here).
        case direct
    }

    private let socket: Int32
    private let peer: sockaddr_in
    private let kind: Kind
    private let tls: TLSServerContext
    private let handOff: ConnectionFront.HandOff
    /// The host of the CONNECT request, once read.
    private var connectHost: String?
    /// Seconds for the CONNECT request and for the TLS handshake each.
    private let setupTimeout: Double = 10
    /// A tunnel with no traffic either way for this long is closed.
    private let idleTimeout: Int32 = 120_000
    /// Largest CONNECT request head.
    private static let headLimit = 8 << 10

    init(socket: Int32, peer: sockaddr_in, kind: Kind, tls: TLSServerContext, handOff: @escaping ConnectionFront.HandOff) {
        self.socket = socket
        self.peer = peer
        self.kind = kind
        self.tls = tls
        self.handOff = handOff
    }

    func run() {
        if kind == .proxy {
            switch readConnect() {
            case .notConnect:
                handOff(socket, peer, nil)  // plain HTTP that happens to start with C
                return
            case .refused:
                close(socket)
                return
            case .tunnel:
                break
            }
        }
        guard let ssl = SSL_new(tls.context) else {
            close(socket)
            return
        }
        defer {
            SSL_free(ssl)
            close(socket)
        }
        SSL_set_fd(ssl, socket)
        guard handshake(ssl) else { return }
        var pair: [Int32] = [0, 0]
        guard socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0 else { return }
        let local = pair[0]
        defer { close(local) }
        _ = fcntl(local, F_SETFL, fcntl(local, F_GETFL) | O_NONBLOCK)
        // The name the client asked for: the CONNECT target, else SNI (empty for a direct client that sent none).
        let named = connectHost ?? SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name).map { String(cString: $0).lowercased() } ?? ""
        handOff(pair[1], peer, named)
        pump(ssl, local)
        _ = SSL_shutdown(ssl)
    }

    // MARK: - CONNECT

    private enum ConnectOutcome { case tunnel, notConnect, refused }

    private func readConnect() -> ConnectOutcome {
        let deadline = ConnectionFront.now() + setupTimeout
        let method = Array("CONNECT ".utf8)
        // Peek until the method is known (three seconds at most): anything else stays unread for libmicrohttpd.
        let methodDeadline = ConnectionFront.now() + 3
        var pause: UInt32 = 2_000
        while true {
            var peeked = [UInt8](repeating: 0, count: method.count)
            let count = recv(socket, &peeked, method.count, Int32(MSG_PEEK))
            if count == 0 { return .refused }
            if count > 0 {
                if Array(peeked.prefix(count)) != Array(method.prefix(count)) { return .notConnect }
                if count == method.count { break }
                // Part of the method has come; poll would report it again at once, so wait, longer each time.
                guard ConnectionFront.now() < methodDeadline else { return .refused }
                usleep(pause)
                pause = min(pause * 2, 100_000)
            } else if errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                return .refused
            }
            guard wait(for: Int16(POLLIN), until: min(deadline, methodDeadline)) else { return .refused }
        }
        // Byte by byte, so not one byte of the TLS handshake behind the head is consumed here.
        var head: [UInt8] = []
        while !head.ends(with: [13, 10, 13, 10]) {
            guard head.count < Self.headLimit else {
                Self.reply(socket, status: "431 Request Header Fields Too Large", message: "The CONNECT request is larger than 8 KB.")
                return .refused
            }
            var byte: UInt8 = 0
            let count = recv(socket, &byte, 1, 0)
            if count == 1 {
                head.append(byte)
            } else if count == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return .refused
            } else if !wait(for: Int16(POLLIN), until: deadline) {
                return .refused
            }
        }
        let line = String(decoding: head.prefix { $0 != 13 }, as: UTF8.self).split(separator: " ")
        guard line.count == 3, line[0] == "CONNECT", line[2].hasPrefix("HTTP/1.") else {
            Self.reply(socket, status: "400 Bad Request", message: "Expected 'CONNECT host:443 HTTP/1.1'.")
            return .refused
        }
        let target = line[1].lowercased()
        guard let colon = target.lastIndex(of: ":"), target[target.index(after: colon)...] == "443",
              tls.serves(String(target[..<colon])) else {
            let names = tls.hosts.sorted().joined(separator: ", ")
            Self.reply(socket, status: "403 Forbidden",
                       message: "This proxy tunnels only to the App Store hosts it emulates, on port 443: \(names).")
            return .refused
        }
        connectHost = String(target[..<colon])
        return Self.writeAll(socket, Array("HTTP/1.1 200 Connection Established\r\n\r\n".utf8), until: deadline) ? .tunnel : .refused
    }

    /// Writes a short plain-text answer to a proxy request (best effort; the connection closes after it).
    static func reply(_ socket: Int32, status: String, message: String) {
        let body = message + "\n"
        let text = "HTTP/1.1 \(status)\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
        _ = writeAll(socket, Array(text.utf8), until: ConnectionFront.now() + 2)
    }

    private static func writeAll(_ socket: Int32, _ bytes: [UInt8], until deadline: Double) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { send(socket, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if written > 0 {
                offset += written
            } else if written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                var fd = pollfd(fd: socket, events: Int16(POLLOUT), revents: 0)
                let remaining = Int32((deadline - ConnectionFront.now()) * 1000)
                guard remaining > 0 else { return false }
                let ready = poll(&fd, 1, remaining)
                // Interrupted by a signal: sent again, and the deadline checked again.
                guard ready > 0 || (ready < 0 && errno == EINTR) else { return false }
            } else {
                return false
            }
        }
        return true
    }

    // MARK: - TLS

    private func handshake(_ ssl: OpaquePointer) -> Bool {
        let deadline = ConnectionFront.now() + setupTimeout
        while true {
            let result = SSL_accept(ssl)
            if result == 1 { return true }
            switch SSL_get_error(ssl, result) {
            case SSL_ERROR_WANT_READ: guard wait(for: Int16(POLLIN), until: deadline) else { return false }
            case SSL_ERROR_WANT_WRITE: guard wait(for: Int16(POLLOUT), until: deadline) else { return false }
            default:
                ERR_clear_error()
                return false
            }
        }
    }

    private func wait(for events: Int16, until deadline: Double) -> Bool {
        var fd = pollfd(fd: socket, events: events, revents: 0)
        let remaining = Int32((deadline - ConnectionFront.now()) * 1000)
        // Interrupted by a signal: true, so the caller tries again and comes back with the deadline checked again.
        guard remaining > 0 else { return false }
        let ready = poll(&fd, 1, remaining)
        return ready > 0 || (ready < 0 && errno == EINTR)
    }

    // MARK: - Pumping

    /// Moves bytes both ways until either side closes: TLS → `local` (requests) and `local` → TLS (responses).
    /// Each round tries every step that is not blocked; only a round that moved nothing sleeps in `poll`, on
    /// exactly what the blocked steps wait for.
    private func pump(_ ssl: OpaquePointer, _ local: Int32) {
        let chunk = 16 << 10
        let cap = chunk * 4
        var toLocal: [UInt8] = []
        var toTLS: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: chunk)
        var clientClosed = false
        var halfClosed = false
        var serverClosed = false
        while true {
            var progress = false
            var tlsEvents: Int16 = 0
            var localEvents: Int16 = 0
            if !clientClosed && toLocal.count < cap {
                let count = SSL_read(ssl, &buffer, Int32(chunk))
                if count > 0 {
                    toLocal += buffer.prefix(Int(count))
                    progress = true
                } else {
                    switch SSL_get_error(ssl, count) {
                    case SSL_ERROR_WANT_READ: tlsEvents |= Int16(POLLIN)
                    case SSL_ERROR_WANT_WRITE: tlsEvents |= Int16(POLLOUT)
                    default:
                        ERR_clear_error()
                        clientClosed = true
                        progress = true
                    }
                }
            }
            if !toLocal.isEmpty {
                let written = toLocal.withUnsafeBytes { send(local, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if written > 0 {
                    toLocal.removeFirst(written)
                    progress = true
                } else if written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                    localEvents |= Int16(POLLOUT)
                } else {
                    // libmicrohttpd closed (an early answer such as 413, or its timeout): the rest of the request
                    // goes nowhere, but what it answered is still to be read and sent.
                    toLocal.removeAll()
                    clientClosed = true
                    halfClosed = true
                    progress = true
                }
            }
            if clientClosed && toLocal.isEmpty && !halfClosed {
                shutdown(local, Int32(SHUT_WR))  // libmicrohttpd sees the client's end of stream and closes
                halfClosed = true
                progress = true
            }
            if !serverClosed && toTLS.count < cap {
                let count = recv(local, &buffer, chunk, 0)
                if count > 0 {
                    toTLS += buffer.prefix(count)
                    progress = true
                } else if count < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
                    localEvents |= Int16(POLLIN)
                } else {
                    serverClosed = true
                    progress = true
                }
            }
            if !toTLS.isEmpty {
                let count = toTLS.withUnsafeBytes { SSL_write(ssl, $0.baseAddress, Int32($0.count)) }
                if count > 0 {
                    toTLS.removeFirst(Int(count))
                    progress = true
                } else {
                    switch SSL_get_error(ssl, count) {
                    case SSL_ERROR_WANT_WRITE: tlsEvents |= Int16(POLLOUT)
                    case SSL_ERROR_WANT_READ: tlsEvents |= Int16(POLLIN)
                    default:
                        ERR_clear_error()
                        return
                    }
                }
            }
            if serverClosed && toTLS.isEmpty { return }
            if progress { continue }
            guard tlsEvents != 0 || localEvents != 0 else { return }
            // A socket nothing waits on is left out (fd -1): poll reports hang-ups even for no events, and would spin.
            var fds = [pollfd(fd: tlsEvents == 0 ? -1 : socket, events: tlsEvents, revents: 0),
                       pollfd(fd: localEvents == 0 ? -1 : local, events: localEvents, revents: 0)]
            let ready = poll(&fds, 2, idleTimeout)
            if ready == 0 || (ready < 0 && errno != EINTR) { return }
            if (fds[0].revents | fds[1].revents) & Int16(POLLNVAL) != 0 { return }
        }
    }
}

extension Array where Element == UInt8 {
    fileprivate func ends(with suffix: [UInt8]) -> Bool {
        count >= suffix.count && Array(self[(count - suffix.count)...]) == suffix
    }
}
