import CLibPQ
import Foundation
import Storage
import Synchronization

/// PostgreSQL through libpq: a pool of connections, each owned by its own serial queue, and one
/// listening connection for LISTEN/NOTIFY wake-ups between server processes.
public final class PostgresDatabase: SQLDatabase {
    public let dialect = SQLDialect.postgres
    let url: String
    private let pool: Mutex<Pool>
    private let listener: PostgresListener

    private struct Pool {
        var idle: [PostgresConnection]
        var waiters: [CheckedContinuation<PostgresConnection, Never>] = []
    }

    /// Connects `size` connections to `url` (a `postgres://` URL or libpq keyword string) and
    /// listens on `channels` for wake-ups.
    public init(url: String, size: Int = 8, channels: [String] = []) throws {
        self.url = url
        var connections: [PostgresConnection] = []
        for index in 0..<max(1, size) {
            connections.append(try PostgresConnection(url: url, label: "storekeeper.postgres.\(index)"))
        }
        pool = Mutex(Pool(idle: connections))
        listener = try PostgresListener(url: url, channels: channels)
    }

    private func acquire() async -> PostgresConnection {
        if let connection = pool.withLock({ $0.idle.popLast() }) { return connection }
        return await withCheckedContinuation { continuation in
            let ready: PostgresConnection? = pool.withLock { pool in
                if let connection = pool.idle.popLast() { return connection }
                pool.waiters.append(continuation)
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }

    private func release(_ connection: PostgresConnection) {
        let waiter: CheckedContinuation<PostgresConnection, Never>? = pool.withLock { pool in
            if pool.waiters.isEmpty {
                pool.idle.append(connection)
                return nil
            }
            return pool.waiters.removeFirst()
        }
        waiter?.resume(returning: connection)
    }

    public func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        let connection = await acquire()
        defer { release(connection) }
        return try await withCheckedThrowingContinuation { continuation in
            connection.queue.async {
                if !connection.isHealthy { connection.reset() }
                continuation.resume(with: Result {
                    _ = try connection.execute("BEGIN", [])
                    do {
                        let result = try body(PostgresTransactionConnection(connection: connection))
                        _ = try connection.execute("COMMIT", [])
                        return result
                    } catch {
                        _ = try? connection.execute("ROLLBACK", [])
                        throw error
                    }
                })
            }
        }
    }

    public func notify(_ channel: String) async {
        _ = try? await transaction { db in try db.query("SELECT pg_notify(?, '')", [channel]) }
    }

    public func wait(for channel: String, timeout: Duration) async {
        await listener.wait(for: channel, timeout: timeout)
    }

    public func close() async {
        listener.stop()
    }
}

/// A dedicated connection that LISTENs and wakes waiters when a notification arrives.
// The handle is only used on the listener's own thread (`loop`); waiters are kept under a lock.
final class PostgresListener: @unchecked Sendable {
    private let connection: PostgresConnection
    private let state = Mutex<State>(State())

    private struct State {
        var channels: Set<String> = []
        var waiters: [String: [CheckedContinuation<Void, Never>]] = [:]
        var stopped = false
    }

    init(url: String, channels: [String]) throws {
        connection = try PostgresConnection(url: url, label: "storekeeper.postgres.listener")
        for channel in channels where channel.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "_" }) {
            _ = try connection.execute("LISTEN \(channel)", [])
            state.withLock { _ = $0.channels.insert(channel) }
        }
        if !channels.isEmpty { startPolling() }
    }

    /// Waits for a notification on `channel` or the timeout (only the timeout for channels not listened to).
    func wait(for channel: String, timeout: Duration) async {
        guard state.withLock({ $0.channels.contains(channel) }) else {
            try? await Task.sleep(for: timeout)
            return
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    self.state.withLock { $0.waiters[channel, default: []].append(continuation) }
                }
            }
            group.addTask { try? await Task.sleep(for: timeout) }
            await group.next()
            group.cancelAll()
            // Wake a still-registered waiter of this call so the group can finish.
            self.wakeAll(channel)
        }
    }

    private let polling = Mutex(false)

    private func startPolling() {
        let start = polling.withLock { running -> Bool in
            if running { return false }
            running = true
            return true
        }
        guard start else { return }
        connection.queue.async { [self] in
            while !state.withLock({ $0.stopped }) {
                let ready = shim_pq_wait_readable(connection.handle, 250)
                if ready > 0 { PQconsumeInput(connection.handle) }
                var woken: Set<String> = []
                while let notification = PQnotifies(connection.handle) {
                    woken.insert(String(cString: notification.pointee.relname))
                    PQfreemem(notification)
                }
                for channel in woken { wakeAll(channel) }
                if !connection.isHealthy {
                    connection.reset()
                    for channel in state.withLock({ $0.channels }) { _ = try? connection.execute("LISTEN \(channel)", []) }
                }
            }
        }
    }

    private func wakeAll(_ channel: String) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            let list = state.waiters[channel] ?? []
            state.waiters[channel] = []
            return list
        }
        for waiter in waiters { waiter.resume() }
    }

    func stop() {
        state.withLock { $0.stopped = true }
        for channel in state.withLock({ Array($0.waiters.keys) }) { wakeAll(channel) }
    }
}
