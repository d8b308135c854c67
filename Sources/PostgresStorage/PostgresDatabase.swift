import CLibPQ
import Foundation
import Locking
import Storage
import Synchronization

/// PostgreSQL through libpq: a pool of connections, each owned by its own serial queue, and one
/// listening connection for LISTEN/NOTIFY wake-ups between server processes.
///
/// Work waits for a connection in the pool, not in a task: a connection that finishes a piece of work takes the
/// next waiting one on its own queue. Under load (more requests than connections) a read then costs one hand-off to
/// the connection and one back, where handing the freed connection to a waiting task first cost two more wake-ups.
public final class PostgresDatabase: SQLDatabase {
    public let dialect = SQLDialect.postgres
    let url: String
    private let pool: Locked<Pool>
    private let listener: PostgresListener

    /// A piece of work for a connection, run on the connection's queue.
    private typealias Work = @Sendable (PostgresConnection) -> Void

    private struct Pool {
        var idle: [PostgresConnection]
        /// Work waiting for a connection, oldest first from `head` (taken slots are emptied at once).
        private var waiting: [Work?] = []
        private var head = 0

        init(idle: [PostgresConnection]) { self.idle = idle }

        var waitingCount: Int { waiting.count - head }

        mutating func wait(_ work: @escaping Work) { waiting.append(work) }

        /// The oldest waiting work, if any.
        mutating func next() -> Work? {
            guard head < waiting.count else { return nil }
            defer {
                waiting[head] = nil
                head += 1
                if head == waiting.count {
                    waiting.removeAll(keepingCapacity: true)
                    head = 0
                } else if head >= 1024 {
                    waiting.removeFirst(head)
                    head = 0
                }
            }
            return waiting[head]
        }
    }
    private let size: Int

    public var poolStatistics: (inUse: Int, idle: Int, waiting: Int)? {
        pool.withLock { pool in (size - pool.idle.count, pool.idle.count, pool.waitingCount) }
    }

    /// Connects `size` connections to `url` (a `postgres://` URL or libpq keyword string) and
    /// listens on `channels` for wake-ups.
    public init(url: String, size: Int = 8, channels: [String] = []) throws {
        self.url = url
        var connections: [PostgresConnection] = []
        for index in 0..<max(1, size) {
            connections.append(try PostgresConnection(url: url, label: "storekeeper.postgres.\(index)"))
        }
        pool = Locked(Pool(idle: connections))
        self.size = connections.count
        listener = try PostgresListener(url: url, channels: channels)
    }


    public func transaction<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await onConnection { connection in
            // BEGIN travels with the first statement, COMMIT with the last held ones: no round trip of their own.
            try connection.enqueue("BEGIN", [])
            do {
                let result = try body(PostgresTransactionConnection(connection: connection))
                try connection.commit()
                return result
            } catch {
                if connection.discardPending() { _ = try? connection.execute("ROLLBACK", []) }
                throw error
            }
        }
    }

    public func read<T: Sendable>(_ body: @escaping @Sendable (any SQLConnection) throws -> T) async throws -> T {
        try await onConnection { connection in
            do {
                let result = try body(PostgresTransactionConnection(connection: connection))
                try connection.finishWithoutCommit()
                return result
            } catch {
                _ = connection.discardPending()
                throw error
            }
        }
    }

    /// Runs `work` on a pooled connection's queue, the connection made ready first (reset if a failure left it in a
    /// pipeline or a transaction; plans refreshed when stale).
    private func onConnection<T: Sendable>(_ work: @escaping @Sendable (PostgresConnection) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            let item: Work = { connection in
                if !connection.isHealthy { connection.reset() }
                connection.refreshPlansIfStale()
                continuation.resume(with: Result { try work(connection) })
            }
            let idle: PostgresConnection? = pool.withLock { pool in
                if let connection = pool.idle.popLast() { return connection }
                pool.wait(item)
                return nil
            }
            if let idle { drain(idle, first: item) }
        }
    }

    /// Runs `first` on the connection's queue, then the work that waits for a connection, until none does and the
    /// connection goes back to the idle ones.
    private func drain(_ connection: PostgresConnection, first: @escaping Work) {
        connection.queue.async { [self] in
            var next: Work? = first
            while let work = next {
                work(connection)
                next = pool.withLock { pool in
                    if let waiting = pool.next() { return waiting }
                    pool.idle.append(connection)
                    return nil
                }
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
// The handle is used only by the listener's own thread (a plain Thread, not a dispatch queue, because
// it blocks in poll() for its whole life and must not hold one of Dispatch's limited worker threads);
// waiters are kept under a lock.
final class PostgresListener: @unchecked Sendable {
    private let connection: PostgresConnection
    private let state = Locked<State>(State())

    private struct State {
        var channels: Set<String> = []
        /// Waiters per channel, each with the moment it stops waiting (checked by the listening thread's loop,
        /// which wakes at least every 250 ms: no timer per wait).
        var waiters: [String: [(deadline: ContinuousClock.Instant, continuation: CheckedContinuation<Void, Never>)]] = [:]
        var stopped = false
    }

    init(url: String, channels: [String]) throws {
        connection = try PostgresConnection(url: url, label: "storekeeper.postgres.listener")
        let valid = channels.filter { $0.allSatisfy { $0.isLetter || $0.isNumber || $0 == "_" } }
        for channel in valid {
            _ = try connection.execute("LISTEN \(channel)", [])
        }
        state.withLock { $0.channels = Set(valid) }
        if !valid.isEmpty {
            let thread = Thread { [self] in loop() }
            thread.name = "storekeeper.postgres.listener"
            thread.start()
        }
    }

    /// Waits for a notification on `channel` or the timeout (only the timeout for channels not listened to).
    func wait(for channel: String, timeout: Duration) async {
        guard state.withLock({ $0.channels.contains(channel) && !$0.stopped }) else {
            try? await Task.sleep(for: timeout)
            return
        }
        let deadline = ContinuousClock.now.advanced(by: timeout)
        await withCheckedContinuation { continuation in
            let stopped = state.withLock { state -> Bool in
                if state.stopped { return true }
                state.waiters[channel, default: []].append((deadline, continuation))
                return false
            }
            if stopped { continuation.resume() }
        }
    }

    private func loop() {
        while !state.withLock({ $0.stopped }) {
            let ready = shim_pq_wait_readable(connection.handle, 250)
            if ready > 0 { PQconsumeInput(connection.handle) }
            var woken: Set<String> = []
            while let notification = PQnotifies(connection.handle) {
                woken.insert(String(cString: notification.pointee.relname))
                PQfreemem(notification)
            }
            for channel in woken { wakeAll(channel) }
            wakeExpired()
            if !connection.isHealthy {
                connection.reset()
                for channel in state.withLock({ $0.channels }) { _ = try? connection.execute("LISTEN \(channel)", []) }
                if !connection.isHealthy { Thread.sleep(forTimeInterval: 0.5) }
            }
        }
    }

    private func wakeAll(_ channel: String) {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            let list = state.waiters[channel] ?? []
            state.waiters[channel] = []
            return list.map(\.continuation)
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Wakes the waiters whose timeout has passed.
    private func wakeExpired() {
        let now = ContinuousClock.now
        let expired = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            var expired: [CheckedContinuation<Void, Never>] = []
            for (channel, list) in state.waiters where list.contains(where: { $0.deadline <= now }) {
                expired += list.filter { $0.deadline <= now }.map(\.continuation)
                state.waiters[channel] = list.filter { $0.deadline > now }
            }
            return expired
        }
        for waiter in expired { waiter.resume() }
    }

    func stop() {
        let channels = state.withLock { state -> [String] in
            state.stopped = true
            return Array(state.waiters.keys)
        }
        for channel in channels { wakeAll(channel) }
    }
}
