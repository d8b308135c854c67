import CSQLite
import Foundation
import Storage
import Synchronization

/// The single owner of a `sqlite3` connection. Every call runs on the owner's serial queue, so the
/// handle is never used from two threads and blocking I/O never runs on the cooperative pool.
// Access to `handle` happens only on `queue` (see `run`), which is what makes this type Sendable.
public final class SQLiteDatabase: @unchecked Sendable {
    private let handle: OpaquePointer
    private let queue: DispatchQueue
    /// Prepared statements by SQL text, reused (reset) across calls; only touched on `queue`.
    private var statements: [StatementKey: OpaquePointer] = [:]
    /// The texts of row writes by their parts; only touched on `queue`.
    var sqlTexts = SQLTextCache()
    /// The file path (or `:memory:`).
    public let path: String
    /// Copies the write-ahead log into the database file on its own connection and queue (nil in memory).
    private var checkpointer: Checkpointer?  // set once, in init

    /// A writing connection's page cache, in KiB: 16 MiB rather than SQLite's 2 (every database opened with
    /// `init(path:)`: the purchase server's, the emulator's, a device's journal; the cache fills only as pages are read,
    /// so a small database costs no more). With Apple taking seconds, a settlement batch reads the pages of jobs, users
    /// and indexes written seconds before; at 2 MiB they had left the cache, so they were read again from the file
    /// (`pread`, 6.8% of the server's samples at 3,500 receipts/s with 3–6 s on every call) and the batch's dirty pages
    /// spilled into the log before its commit (`PcacheFetchStress`, 5.5%) (bench/README, forty-second round). Instantly
    /// it made no difference (2,400 receipts/s, fourth round). Reading connections keep SQLite's default.
    static let writerCacheKiB = 16_384

    /// Opens (creating if needed) a database in WAL mode.
    public init(path: String) throws {
        handle = try openHandle(path, flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, for: "")
        self.path = path
        queue = DispatchQueue(label: "storekeeper.sqlite.\(path)")
        var walMode = false
        try queue.sync {
            walMode = try queryWithColumns("PRAGMA journal_mode=WAL").rows.first?.first.flatMap {
                if case .text(let mode) = $0 { return mode.lowercased() == "wal" } else { return nil }
            } ?? false
            try execute("PRAGMA synchronous=NORMAL")
            try execute("PRAGMA foreign_keys=ON")
            // Statement journals and sorts in memory: a multi-row UPDATE inside a transaction otherwise creates,
            // writes and unlinks a file in /var/tmp once its journal passes 64 KiB.
            try execute("PRAGMA temp_store=MEMORY")
            // A log that grew while a long read held its snapshot (it cannot restart past one) is cut back to 64 MiB when
            // it restarts, not kept at its largest on disk; under steady writes it stays below that (checkpoints every
            // thousand pages, 4 MiB, and the writer's own every eight thousand).
            try execute("PRAGMA journal_size_limit=67108864")
            try execute("PRAGMA cache_size=-\(Self.writerCacheKiB)")
        }
        checkpointer = walMode ? try Checkpointer(path: path) : nil
        if let checkpointer {
            // Replaces SQLite's automatic checkpoint, which would run (and fsync) on this queue inside a commit.
            sqlite3_wal_hook(handle, checkpointHook, Unmanaged.passUnretained(checkpointer).toOpaque())
        }
    }

    /// Opens a reading connection to the database another `SQLiteDatabase` owns at `path` (in WAL mode): it sees the
    /// last commit when each of its transactions begins, never waits for the writer nor holds it up, and refuses
    /// every write (`query_only`).
    public init(readerOf path: String) throws {
        handle = try openHandle(path, flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, for: " to read")
        self.path = path
        queue = DispatchQueue(label: "storekeeper.sqlite.reader.\(path)")
        try queue.sync {
            try execute("PRAGMA query_only=ON")
            // A large sort (a report's GROUP BY over years of sales) spills to a temporary file past the page cache:
            // in memory, the revenue report over ten million ledger rows grew the process by 1.8 GB; on file, 30 MB.
            try execute("PRAGMA temp_store=FILE")
        }
    }

    deinit {
        for statement in statements.values { sqlite3_finalize(statement) }
        sqlite3_close_v2(handle)  // before the checkpointer goes: no hook call after this
    }

    /// Pages this connection has looked up in its cache since it was opened, found there or read from the file: the
    /// work a statement did, whatever its plan. Call on the database's queue.
    public var pagesTouched: Int {
        var hits: Int32 = 0, misses: Int32 = 0, highwater: Int32 = 0
        sqlite3_db_status(handle, SQLITE_DBSTATUS_CACHE_HIT, &hits, &highwater, 0)
        sqlite3_db_status(handle, SQLITE_DBSTATUS_CACHE_MISS, &misses, &highwater, 0)
        return Int(hits) + Int(misses)
    }

    /// Whether the database is a file in WAL mode, so that other connections can read it beside this one.
    public var isWriteAheadLogged: Bool { checkpointer != nil }

    /// Checkpoints run since the database was opened (0 when it is not in WAL mode).
    public var checkpoints: Int { checkpointer?.count.load(ordering: .relaxed) ?? 0 }

    /// Runs `body` on the database's queue and returns its result to the awaiting task.
    public func run<T: Sendable>(_ body: @escaping @Sendable (SQLiteDatabase) throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            queue.async {
                continuation.resume(with: Result { try body(self) })
            }
        }
    }

    /// Runs `body` synchronously on the database's queue (for startup and tools).
    public func runSync<T>(_ body: (SQLiteDatabase) throws -> T) throws -> T {
        try queue.sync { try body(self) }
    }

    /// Executes SQL without results.
    public func execute(_ sql: String) throws {
        var error: UnsafeMutablePointer<CChar>?
        if sqlite3_exec(handle, sql, nil, nil, &error) != SQLITE_OK {
            let message = error.map { String(cString: $0) } ?? "unknown error"
            sqlite3_free(error)
            throw StorageErrorFactory.make("sql_failed", message)
        }
    }

    /// A bound parameter.
    public enum Value: Sendable {
        case text(String)
        case blob(Data)
        case integer(Int64)
        case null
    }

    /// Executes one statement with parameters; returns rows as arrays of values (text and blob columns).
    @discardableResult
    public func query(_ sql: String, _ parameters: [Value] = []) throws -> [[Value]] {
        try queryWithColumns(sql, parameters).rows
    }

    /// Executes one statement and returns the column names with the rows.
    public func queryWithColumns(_ sql: String, _ parameters: [Value] = []) throws -> (columns: [String], rows: [[Value]]) {
        try readRows(sql, bind: { statement in
            for (offset, parameter) in parameters.enumerated() {
                let index = Int32(offset + 1)
                switch parameter {
                case .text(let text): bind(text, at: index, of: statement)
                case .blob(let data): _ = data.withUnsafeBytes { shim_sqlite3_bind_blob_transient(statement, index, $0.baseAddress, Int32($0.count)) }
                case .integer(let value): sqlite3_bind_int64(statement, index, value)
                case .null: sqlite3_bind_null(statement, index)
                }
            }
        }, value: { statement, column in
            switch sqlite3_column_type(statement, column) {
            case SQLITE_NULL: return .null
            case SQLITE_INTEGER: return .integer(sqlite3_column_int64(statement, column))
            case SQLITE_BLOB: return .blob(blob(of: statement, column).map { Data($0) } ?? Data())
            default: return .text(text(of: statement, column))
            }
        })
    }

    /// Executes one statement with `SQLValue` parameters, straight into `SQLRow`s (no values in between: every
    /// statement of a settlement passes here). Blobs read as UTF-8 text, as `SQLConnection` has no blobs.
    func rows(_ sql: String, _ parameters: [any SQLBindable]) throws -> [SQLRow] {
        let (columns, rows) = try readRows(sql, bind: { statement in bind(parameters, to: statement) }, value: { statement, column -> SQLValue in
            switch sqlite3_column_type(statement, column) {
            case SQLITE_NULL: return .null
            case SQLITE_INTEGER: return .integer(sqlite3_column_int64(statement, column))
            case SQLITE_BLOB: return .text(blob(of: statement, column).map { String(decoding: $0, as: UTF8.self) } ?? "")
            default: return .text(text(of: statement, column))
            }
        })
        return rows.map { SQLRow(columns: columns, values: $0) }
    }

    /// Executes one statement that returns no rows with `SQLValue` parameters, and returns how many rows it inserted,
    /// updated or deleted itself (`sqlite3_changes`: not those of triggers or foreign-key actions). What a `RETURNING` of
    /// the key would tell of an insert under a conflict clause, without SQLite gathering the returned rows in a table
    /// of its own first. Throws if the statement returns a row.
    func changes(_ sql: String, _ parameters: [any SQLBindable]) throws -> Int {
        try withStatement(sql) { statement in
            bind(parameters, to: statement)
            guard try !step(statement) else { throw StorageErrorFactory.make("sql_failed", "a statement counted for its changes returned a row") }
            return Int(sqlite3_changes(handle))
        }
    }

    private func bind(_ parameters: [any SQLBindable], to statement: OpaquePointer) {
        for (offset, parameter) in parameters.enumerated() {
            let index = Int32(offset + 1)
            switch parameter.sqlValue {
            case .text(let text): bind(text, at: index, of: statement)
            case .integer(let value): sqlite3_bind_int64(statement, index, value)
            case .null: sqlite3_bind_null(statement, index)
            }
        }
    }

    /// Prepares (or reuses) `sql`, binds its parameters, and reads every row a value at a time.
    private func readRows<V>(_ sql: String, bind: (OpaquePointer) -> Void,
                            value: (OpaquePointer, Int32) -> V) throws -> (columns: [String], rows: [[V]]) {
        try withStatement(sql) { statement in
            bind(statement)
            let columns = columnNames(of: statement)
            var rows: [[V]] = []
            while try step(statement) {
                var row: [V] = []
                row.reserveCapacity(columns.count)
                for column in 0..<Int32(columns.count) { row.append(value(statement, column)) }
                rows.append(row)
            }
            return (columns, rows)
        }
    }

    /// Runs `body` with the prepared statement for `sql`, then resets it and clears its bindings on every path, so the
    /// next use of the same text starts afresh.
    private func withStatement<T>(_ sql: String, _ body: (OpaquePointer) throws -> T) throws -> T {
        let statement = try prepared(sql)
        defer {
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
        }
        return try body(statement)
    }

    /// The statement for `sql`, prepared once and kept (at most 256; all are let go when that is passed).
    private func prepared(_ sql: String) throws -> OpaquePointer {
        if let cached = statements[StatementKey(sql)] { return cached }
        var prepared: OpaquePointer?
        guard sqlite3_prepare_v2(handle, sql, -1, &prepared, nil) == SQLITE_OK, let prepared else {
            throw StorageErrorFactory.make("sql_failed", String(cString: sqlite3_errmsg(handle)))
        }
        if statements.count > 256 {
            for old in statements.values { sqlite3_finalize(old) }
            statements.removeAll()
        }
        statements[StatementKey(sql)] = prepared
        return prepared
    }

    /// With its byte length: text holding a NUL is stored whole, never cut at the NUL. Bound from the string's own
    /// UTF-8 (a short string's on the stack): passing a `String` as `const char *` copies a short one to the heap
    /// first, which was about seventy allocations per notification.
    private func bind(_ text: String, at index: Int32, of statement: OpaquePointer) {
        var text = text
        text.withUTF8 { bytes in
            guard let start = bytes.baseAddress, !bytes.isEmpty else {
                _ = shim_sqlite3_bind_text_transient(statement, index, "", 0)  // empty text, not NULL
                return
            }
            start.withMemoryRebound(to: CChar.self, capacity: bytes.count) {
                _ = shim_sqlite3_bind_text_transient(statement, index, $0, Int32(clamping: bytes.count))
            }
        }
    }

    /// Whether the statement produced a row (false once it is done).
    private func step(_ statement: OpaquePointer) throws -> Bool {
        switch sqlite3_step(statement) {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default: throw StorageErrorFactory.make("sql_failed", String(cString: sqlite3_errmsg(handle)))
        }
    }

    private func columnNames(of statement: OpaquePointer) -> [String] {
        (0..<sqlite3_column_count(statement)).map { String(cString: sqlite3_column_name(statement, $0)) }
    }

    /// A blob column's bytes (the blob first, then its length: SQLite's order), or nil for an empty one.
    private func blob(of statement: OpaquePointer, _ column: Int32) -> UnsafeRawBufferPointer? {
        guard let bytes = sqlite3_column_blob(statement, column) else { return nil }
        return UnsafeRawBufferPointer(start: bytes, count: Int(sqlite3_column_bytes(statement, column)))
    }

    /// A text column whole, by its byte length (a NUL inside it does not cut it short).
    private func text(of statement: OpaquePointer, _ column: Int32) -> String {
        guard let pointer = sqlite3_column_text(statement, column) else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: pointer, count: Int(sqlite3_column_bytes(statement, column))), as: UTF8.self)
    }
}

/// A connection to `path` that waits up to 5 s for a lock, or `open_failed` naming the path and what it was for.
private func openHandle(_ path: String, flags: Int32, for purpose: String) throws -> OpaquePointer {
    var db: OpaquePointer?
    guard sqlite3_open_v2(path, &db, flags, nil) == SQLITE_OK, let db else {
        let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
        if let db { sqlite3_close(db) }
        throw StorageErrorFactory.make("open_failed", "cannot open \(path)\(purpose): \(message)")
    }
    sqlite3_busy_timeout(db, 5000)
    return db
}

enum StorageErrorFactory {
    static func make(_ code: String, _ message: String) -> StorageError { StorageError(code: code, message: message) }
}

extension SQLiteDatabase {
    /// Copies the whole database into a new file at `destination` with SQLite's online backup API: a
    /// consistent snapshot while other connections (a running server) keep reading and writing.
    public func backup(to destination: String) throws {
        try runSync { database in try database.copy(to: destination) }
    }

    private func copy(to destination: String) throws {
        guard !FileManager.default.fileExists(atPath: destination) else {
            throw StorageErrorFactory.make("backup_exists", "\(destination) exists; back up into a new file")
        }
        var target: OpaquePointer?
        guard sqlite3_open_v2(destination, &target, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil) == SQLITE_OK, let target else {
            if let target { sqlite3_close(target) }
            throw StorageErrorFactory.make("backup_failed", "cannot create \(destination)")
        }
        defer { sqlite3_close(target) }
        guard let backup = sqlite3_backup_init(target, "main", handle, "main") else {
            throw StorageErrorFactory.make("backup_failed", String(cString: sqlite3_errmsg(target)))
        }
        // Pages in steps, so a writer waiting on the source is held up for one step at a time, not the whole copy.
        var status: Int32
        repeat {
            status = sqlite3_backup_step(backup, 1024)
            if status == SQLITE_BUSY || status == SQLITE_LOCKED { sqlite3_sleep(10) }
        } while status == SQLITE_OK || status == SQLITE_BUSY || status == SQLITE_LOCKED
        let finished = sqlite3_backup_finish(backup)
        guard status == SQLITE_DONE, finished == SQLITE_OK else {
            throw StorageErrorFactory.make("backup_failed", "backup stopped: \(String(cString: sqlite3_errstr(status)))")
        }
    }
}

/// Checkpoints off the writer's queue. With `synchronous=NORMAL` a WAL commit writes but never syncs: the
/// syncs are all in checkpoints, which SQLite otherwise runs inside the commit that crosses its threshold,
/// so every writer waited for the disk there. The WAL hook (after each commit, on the writer's queue) asks
/// this second connection for a passive checkpoint instead; only if the log grows far past the threshold
/// (this connection fell behind) does the writer checkpoint itself, as SQLite would have.
///
/// Both count the frames written since they last acted, not the log's length: under constant writes the log
/// is seldom restarted, so its length stays past the threshold and every commit would ask again (measured:
/// 417 checkpoints a second, each with two `fdatasync`, at 1,500 receipts/s).
final class Checkpointer: @unchecked Sendable {
    // Used only on `queue`.
    private let handle: OpaquePointer
    private let queue: DispatchQueue
    private let requested = Atomic<Bool>(false)
    // Used only by the WAL hook, which runs on the writer's queue.
    private var schedule = CheckpointSchedule()
    /// Checkpoints run so far, by either connection.
    let count = Atomic<Int>(0)

    init(path: String) throws {
        handle = try openHandle(path, flags: SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, for: " for checkpoints")
        queue = DispatchQueue(label: "storekeeper.sqlite.checkpoint")
        sqlite3_exec(handle, "PRAGMA synchronous=NORMAL", nil, nil, nil)
    }

    deinit {
        sqlite3_close_v2(handle)
    }

    /// Starts a passive checkpoint unless one is already waiting or running.
    func request() {
        guard requested.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged else { return }
        queue.async { [self] in
            requested.store(false, ordering: .releasing)
            checkpoint(handle, nil)
        }
    }

    /// Runs a passive checkpoint on `db` (this connection's, or the writer's when it falls behind); false when
    /// it could not run (`SQLITE_BUSY`: the other connection is checkpointing).
    @discardableResult
    func checkpoint(_ db: OpaquePointer?, _ name: UnsafePointer<CChar>?) -> Bool {
        count.add(1, ordering: .relaxed)
        return sqlite3_wal_checkpoint_v2(db, name, SQLITE_CHECKPOINT_PASSIVE, nil, nil) == SQLITE_OK
    }

    /// Called by the WAL hook after each commit with the log's length and the writer's connection.
    func committed(pages: Int32, _ db: OpaquePointer?, _ name: UnsafePointer<CChar>?) {
        switch schedule.committed(pages: pages) {
        case .force: if checkpoint(db, name) { schedule.forced(at: pages) }
        case .request: request()
        case .none: break
        }
    }
}

/// When to checkpoint, from the log's length after each commit: the rule the WAL hook applies.
///
/// A checkpoint is asked of the second connection once per `threshold` new pages since the last ask, and run by
/// the writer itself once per eight times that since it last ran one. Only the writer's own checkpoint lets a
/// constantly written log restart, so one that could not run (the other connection was checkpointing) is due
/// again after the next commit. A log shorter than before has restarted from its first frame.
struct CheckpointSchedule: Equatable {
    /// SQLite's own default threshold, in pages of log.
    static let threshold: Int32 = 1000

    enum Step: Equatable {
        case none
        /// Ask the second connection for a passive checkpoint.
        case request
        /// Checkpoint on the writer's connection now; call `forced(at:)` if it ran.
        case force
    }

    private(set) var requestedAt: Int32 = 0
    private(set) var forcedAt: Int32 = 0

    mutating func committed(pages: Int32) -> Step {
        if pages < requestedAt { requestedAt = 0 }
        if pages < forcedAt { forcedAt = 0 }
        if pages - forcedAt >= Self.threshold * 8 {
            requestedAt = pages
            return .force
        }
        if pages - requestedAt >= Self.threshold {
            requestedAt = pages
            return .request
        }
        return .none
    }

    /// The writer's checkpoint ran with the log `pages` long.
    mutating func forced(at pages: Int32) { forcedAt = pages }
}

/// The WAL hook: `context` is the database's `Checkpointer`, `pages` the log's length after a commit.
private func checkpointHook(_ context: UnsafeMutableRawPointer?, _ db: OpaquePointer?, _ name: UnsafePointer<CChar>?, _ pages: Int32) -> Int32 {
    guard let context else { return SQLITE_OK }
    Unmanaged<Checkpointer>.fromOpaque(context).takeUnretainedValue().committed(pages: pages, db, name)
    return SQLITE_OK
}

/// A statement's SQL text as the key of the prepared statements: hashed by its length and its first and last 32 bytes,
/// compared byte for byte (two texts `String` calls equal, canonically equivalent but other bytes, are other statements).
/// Every statement run looks its text up: with `String`'s hash of the whole text (hundreds of bytes each) the lookup
/// was 1.07% of a notification's server samples, 0.73% with this (bench/README, thirty-third round).
struct StatementKey: Hashable {
    let sql: String

    init(_ sql: String) { self.sql = sql }

    func hash(into hasher: inout Hasher) {
        func combine(_ bytes: UnsafeBufferPointer<UInt8>) {
            hasher.combine(bytes.count)
            hasher.combine(bytes: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: bytes.prefix(32))))
            if bytes.count > 32 { hasher.combine(bytes: UnsafeRawBufferPointer(UnsafeBufferPointer(rebasing: bytes.suffix(32)))) }
        }
        if sql.utf8.withContiguousStorageIfAvailable(combine) == nil { Array(sql.utf8).withUnsafeBufferPointer(combine) }
    }

    static func == (lhs: StatementKey, rhs: StatementKey) -> Bool {
        let equal: Bool? = lhs.sql.utf8.withContiguousStorageIfAvailable { left in
            rhs.sql.utf8.withContiguousStorageIfAvailable { right in
                left.count == right.count && (left.isEmpty || memcmp(left.baseAddress!, right.baseAddress!, left.count) == 0)
            }
        } ?? nil
        return equal ?? lhs.sql.utf8.elementsEqual(rhs.sql.utf8)
    }
}
