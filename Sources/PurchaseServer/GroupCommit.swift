import Locking
import Storage
import Synchronization

/// Collects items written concurrently and commits them in batches: while a batch commits, new
/// items queue up and go together in the next. Each writer returns only after its batch committed,
/// with its own item's outcome. With more than one lane, that many batches may commit at once (each
/// on its own connection), so a database whose round trips, not its CPU, bound one batch at a time
/// takes more; items of different lanes may then commit in either order.
final class GroupCommit<Item: Sendable, Output: Sendable>: Sendable {
    private struct State {
        var pending: [(Item, CheckedContinuation<Output, any Error>)] = []
        /// Batches being flushed now (at most `lanes`).
        var flushing = 0
    }

    private let state = Locked(State())
    private let maxBatch: Int
    private let lanes: Int

    init(maxBatch: Int = 512, lanes: Int = 1) {
        self.maxBatch = maxBatch
        self.lanes = max(1, lanes)
    }

    /// Writes `item` durably, possibly together with others. `flush` writes one batch and returns one
    /// result per item, in order (a caller that finds fewer batches in progress than lanes drives a flushing of its own).
    func write(_ item: Item, flush: @escaping @Sendable ([Item]) async -> [Result<Output, any Error>]) async throws -> Output {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Output, any Error>) in
            let lead = state.withLock { state -> Bool in
                state.pending.append((item, continuation))
                guard state.flushing < lanes else { return false }
                state.flushing += 1
                return true
            }
            if lead { Task { await self.drain(flush) } }
        }
    }

    private func drain(_ flush: @Sendable ([Item]) async -> [Result<Output, any Error>]) async {
        while true {
            let batch = state.withLock { state -> [(Item, CheckedContinuation<Output, any Error>)] in
                let batch = Array(state.pending.prefix(maxBatch))
                state.pending.removeFirst(batch.count)
                if batch.isEmpty { state.flushing -= 1 }
                return batch
            }
            if batch.isEmpty { return }
            let results = await flush(batch.map(\.0))
            for (index, (_, continuation)) in batch.enumerated() {
                continuation.resume(with: index < results.count ? results[index] : .failure(CancellationError()))
            }
        }
    }
}

extension GroupCommit {
    /// Writes `item` together with others in one transaction of `database`, `apply` running once per item in
    /// arrival order. When a batch fails, each of its items is tried again alone, so a bad item fails only itself.
    func write(_ item: Item, in database: any SQLDatabase,
               apply: @escaping @Sendable (Item, any SQLConnection) throws -> Output) async throws -> Output {
        try await write(item) { items -> [Result<Output, any Error>] in
            do {
                return try await database.transaction { db in try items.map { try apply($0, db) } }.map { .success($0) }
            } catch where items.count > 1 {
                var results: [Result<Output, any Error>] = []
                for item in items {
                    do { results.append(.success(try await database.transaction { db in try apply(item, db) })) } catch { results.append(.failure(error)) }
                }
                return results
            } catch {
                return [.failure(error)]
            }
        }
    }
}

extension GroupCommit where Output == Void {
    /// For batches that succeed or fail as a whole.
    func write(_ item: Item, all flush: @escaping @Sendable ([Item]) async throws -> Void) async throws {
        try await write(item) { items -> [Result<Void, any Error>] in
            do {
                try await flush(items)
                return Array(repeating: .success(()), count: items.count)
            } catch {
                return Array(repeating: .failure(error), count: items.count)
            }
        }
    }
}
