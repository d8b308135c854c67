import CSystem
import Clocks
import Foundation
import Locking
#if canImport(Glibc)
import Glibc
#endif
import Synchronization

/// A resolved socket address (IPv4 or IPv6), stored as bytes.
struct SocketAddress: Sendable {
    let family: Int32
    let storage: [UInt8]

    func withSockaddr<T>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T {
        storage.withUnsafeBytes { raw in
            body(raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
        }
    }
}

/// Host names to addresses: numeric hosts at once, names through getaddrinfo off the caller's
/// thread, remembered for a minute.
final class Resolver: Sendable {
    private let cache = Locked<[String: (address: SocketAddress, expires: UInt64)]>([:])
    private let ttl: UInt64 = 60_000_000_000

    func resolve(_ host: String, port: Int) async throws(HTTPClientError) -> SocketAddress {
        let key = "\(host):\(port)"
        let now = Monotonic.now
        if let hit = cache.withLock({ $0[key] }), hit.expires > now { return hit.address }
        if let numeric = Self.numeric(host, port: port) { return numeric }
        let result: Result<SocketAddress, HTTPClientError> = await withCheckedContinuation { continuation in
            DispatchQueue.global().async { continuation.resume(returning: Self.lookUp(host, port: port)) }
        }
        let address = try result.get()
        cache.withLock { $0[key] = (address, Monotonic.now + ttl) }
        return address
    }

    static func numeric(_ host: String, port: Int) -> SocketAddress? {
        guard let port = UInt16(exactly: port) else { return nil }
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        var v4 = sockaddr_in()
        if inet_pton(AF_INET, bare, &v4.sin_addr) == 1 {
            v4.sin_family = sa_family_t(AF_INET)
            v4.sin_port = in_port_t(port.bigEndian)
            return SocketAddress(family: AF_INET, storage: withUnsafeBytes(of: v4) { Array($0) })
        }
        var v6 = sockaddr_in6()
        if inet_pton(AF_INET6, bare, &v6.sin6_addr) == 1 {
            v6.sin6_family = sa_family_t(AF_INET6)
            v6.sin6_port = in_port_t(port.bigEndian)
            return SocketAddress(family: AF_INET6, storage: withUnsafeBytes(of: v6) { Array($0) })
        }
        return nil
    }

    static func lookUp(_ host: String, port: Int) -> Result<SocketAddress, HTTPClientError> {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        hints.ai_family = AF_UNSPEC
        var list: UnsafeMutablePointer<addrinfo>?
        let status = getaddrinfo(host, String(port), &hints, &list)
        guard status == 0, let first = list else {
            return .failure(HTTPClientError(.resolveFailed, "cannot resolve \(host): \(String(cString: gai_strerror(status)))"))
        }
        defer { freeaddrinfo(list) }
        // Prefer IPv4 (the loopback emulator and most hosts answer there), else the first address.
        var chosen = first
        var cursor: UnsafeMutablePointer<addrinfo>? = first
        while let entry = cursor {
            if entry.pointee.ai_family == AF_INET { chosen = entry; break }
            cursor = entry.pointee.ai_next
        }
        let bytes = Array(UnsafeRawBufferPointer(start: chosen.pointee.ai_addr, count: Int(chosen.pointee.ai_addrlen)))
        return .success(SocketAddress(family: chosen.pointee.ai_family, storage: bytes))
    }
}
