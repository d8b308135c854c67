import Clocks
import Locking
import Storage
import Synchronization

/// Collects items written concurrently and commits them in batches: while a batch commits, new
/// items queue up and go together in the next. Each writer returns only after its batch committed,
/// with its own item's outcome. With more than one lane, that many batches may commit at once (each
/// on its own connection), so a database whose round trips, not its CPU, bound one batch at a time
/// takes more; items of different lanes may then commit in either order. With `gathering`, a small
/// batch waits a moment for company while writers arrive fast (see `Gathering`), as long as its oldest item allows.
final class GroupCommit<Item: Sendable, Output: Sendable>: Sendable {
    private struct State {
        /// Each with the moment it came (monotonic nanoseconds; 0 without gathering) and how long it may wait for company.
        var pending: [Pending] = []
        /// Batches being flushed now (at most `lanes`).
        var flushing = 0
        /// The arrivals' pace: when the last item came, and the mean gap between items (nanoseconds, a moving mean).
        var lastArrival: UInt64?
        var meanGap = Double(Gathering.slowestGap)

        mutating func noteArrival(at now: UInt64) {
            if let last = lastArrival {
                // A long idle spell counts as the slowest gap, so that a burst after it is seen as fast within about 20
                // items (35 from the start); writers that read the clock in one order and took the lock in the other, as no gap.
                let gap = now > last ? min(now - last, Gathering.slowestGap) : 0
                meanGap += (Double(gap) - meanGap) / 8
            }
            lastArrival = max(lastArrival ?? 0, now)
        }
    }

    private typealias Pending = (item: Item, continuation: CheckedContinuation<Output, any Error>, arrived: UInt64, patience: Duration?)

    private let state = Locked(State())
    private let maxBatch: Int
    private let lanes: Int
    private let gathering: Gathering?
    /// Batches that waited for company before they were taken.
    let gathered = Atomic<Int>(0)
    /// Items waiting for a batch.
    var waiting: Int { state.withLock { $0.pending.count } }

    init(maxBatch: Int = 512, lanes: Int = 1, gathering: Gathering? = nil) {
        self.maxBatch = maxBatch
        self.lanes = max(1, lanes)
        self.gathering = gathering
    }

    /// Writes `item` durably, possibly together with others. `flush` writes one batch and returns one
    /// result per item, in order (a caller that finds fewer batches in progress than lanes drives a flushing of its own).
    /// `patience`: how long the item may wait for company when it is the oldest of a batch, at most the gathering's
    /// own wait (nil: that wait).
    func write(_ item: Item, patience: Duration? = nil, flush: @escaping @Sendable ([Item]) async -> [Result<Output, any Error>]) async throws -> Output {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Output, any Error>) in
            let now = gathering?.now()
            let lead = state.withLock { state -> Bool in
                state.pending.append((item, continuation, now ?? 0, patience))
                if let now { state.noteArrival(at: now) }
                guard state.flushing < lanes else { return false }
                state.flushing += 1
                return true
            }
            if lead { Task { await self.drain(flush) } }
        }
    }

    private func drain(_ flush: @Sendable ([Item]) async -> [Result<Output, any Error>]) async {
        while true {
            if let gathering, let pause = state.withLock({ state in
                state.pending.first.flatMap { first in
                    gathering.pause(pending: state.pending.count, meanGap: state.meanGap, oldestAge: gathering.now() &- first.arrived,
                                    patience: first.patience)
                }
            }) {
                gathered.add(1, ordering: .relaxed)
                await gathering.sleep(pause)
            }
            let batch = state.withLock { state -> [Pending] in
                let batch = Array(state.pending.prefix(maxBatch))
                state.pending.removeFirst(batch.count)
                if batch.isEmpty { state.flushing -= 1 }
                return batch
            }
            if batch.isEmpty { return }
            let results = await flush(batch.map(\.item))
            for (index, (_, continuation, _, _)) in batch.enumerated() {
                continuation.resume(with: index < results.count ? results[index] : .failure(CancellationError()))
            }
        }
    }
}

/// When a group commit's batch waits for company. A transaction's fixed work (its commit writes every page it touched,
/// the writer's thread is woken for it) is paid once per batch: on SQLite at 2,500 receipts a second, instantly, upload
/// batches of about four cost the server 0.49–0.51 ms of CPU per receipt, and 0.39–0.41 ms once gathered
/// (bench/README, thirty-sixth round). So a batch of fewer than `below` items is taken once its oldest item is `wait`
/// old, not at once, but only when writers arrive fast enough that the rest of the wait should at least double it: a
/// trickle (`wait` or more between items) never waits, nor a lone item after a pause. A batch whose oldest item has
/// waited `wait` already (as while a commit that long ran) is taken at once: with commits that long, batches grow by
/// themselves. At most one wait per batch, so an item waits at most `wait` more than it would have.
struct Gathering: Sendable {
    /// The slowest pace counted (a second between items): longer gaps count as this.
    static let slowestGap: UInt64 = 1_000_000_000

    var wait: Duration
    var below: Int
    /// Monotonic nanoseconds, and the wait itself (injected by tests).
    var now: @Sendable () -> UInt64 = { Monotonic.now }
    var sleep: @Sendable (Duration) async -> Void = { try? await Task.sleep(for: $0) }

    /// Uploads' intake batches on SQLite: an upload's answer waits at most 10 ms more.
    static let uploads = Gathering(wait: .milliseconds(10), below: 64)

    /// Settlement batches on SQLite, each waiting as long as its oldest settlement allows (`patience(afterApple:)`), at
    /// most half a second. While Apple takes seconds, the jobs settling at any moment were uploaded over seconds, so their
    /// rows (the job's, the user's, the ledger's and their indexes') lie spread over hundreds of pages of each table, and
    /// a batch of a few dozen wrote a page of each for almost every job. Gathered for a tenth of Apple's time, a batch
    /// holds hundreds of jobs that share those pages: at 3,000 receipts/s with 3–6 s on every call, 0.38–0.39 ms of server
    /// CPU per receipt at 400 ms against 0.44–0.45 ungathered (bench/README, forty-first round). The oldest settlement's
    /// patience sets the batch's wait when it begins: a settlement that allows none (an instant answer, a signed
    /// transaction) arriving during a wait goes with that batch, at most 500 ms later than alone.
    static let settlements = Gathering(wait: .milliseconds(500), below: 2048)

    /// How long a settlement may wait for company: a tenth of what Apple took to answer it, so that a settlement
    /// waits for others only where Apple already made it wait ten times as long, and an instant answer not at all.
    static func patience(afterApple took: Duration) -> Duration {
        took / 10
    }

    /// How long a batch of `pending` items, the oldest `oldestAge` nanoseconds old, waits with items arriving
    /// `meanGap` nanoseconds apart on average; nil when it is taken at once. `patience` is the oldest item's own (at
    /// most `wait`; nil: `wait`).
    func pause(pending: Int, meanGap: Double, oldestAge: UInt64, patience: Duration? = nil) -> Duration? {
        guard pending > 0, pending < below else { return nil }
        let rest = min(wait, patience ?? wait).seconds * 1e9 - Double(oldestAge)
        guard rest > 0, rest / max(meanGap, 1) >= Double(pending) else { return nil }
        return .nanoseconds(Int64(rest))
    }
}

extension GroupCommit {
    /// Writes `item` together with others in one transaction of `database`, `apply` running once per item in
    /// arrival order. When a batch fails, each of its items is tried again alone, so a bad item fails only itself.
    func write(_ item: Item, in database: any SQLDatabase,
               apply: @escaping @Sendable (Item, any SQLConnection) throws -> Output) async throws -> Output {
        try await write(item, patience: nil) { items -> [Result<Output, any Error>] in
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
