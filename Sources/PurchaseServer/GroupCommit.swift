import Synchronization

/// Collects items written concurrently and commits them in batches: while one batch commits, new
/// items queue up and go together in the next. Each writer returns only after its batch committed.
final class GroupCommit<Item: Sendable>: Sendable {
    private struct State {
        var pending: [(Item, CheckedContinuation<Void, any Error>)] = []
        var flushing = false
    }

    private let state = Mutex(State())

    /// Writes `item` durably, possibly together with others; `flush` writes one batch (the caller
    /// that finds no batch in progress drives the flushing with its closure).
    func write(_ item: Item, flush: @escaping @Sendable ([Item]) async throws -> Void) async throws {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            let lead = state.withLock { state -> Bool in
                state.pending.append((item, continuation))
                guard !state.flushing else { return false }
                state.flushing = true
                return true
            }
            if lead { Task { await self.drain(flush) } }
        }
    }

    private func drain(_ flush: @Sendable ([Item]) async throws -> Void) async {
        while true {
            let batch = state.withLock { state -> [(Item, CheckedContinuation<Void, any Error>)] in
                let batch = Array(state.pending.prefix(512))
                state.pending.removeFirst(batch.count)
                if batch.isEmpty { state.flushing = false }
                return batch
            }
            if batch.isEmpty { return }
            do {
                try await flush(batch.map(\.0))
                for (_, continuation) in batch { continuation.resume() }
            } catch {
                for (_, continuation) in batch { continuation.resume(throwing: error) }
            }
        }
    }
}
