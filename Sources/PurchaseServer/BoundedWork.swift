import Dispatch
import Synchronization

/// Runs CPU-bound checks of unauthenticated input (signature and chain verification of
/// notifications) on its own serial queues, off Swift's cooperative pool (two threads here, which
/// every authenticated request also needs), `width` at a time, with at most `maximumPending`
/// waiting: beyond that the caller is told to come back later, as Apple does on 503. With a
/// `maximumWait`, a check whose turn comes later than that after it was taken is not run either: what
/// a check costs is the sender's choice (an unknown certificate chain costs far more than a known
/// one), so a count alone does not bound how long the last in line waits.
final class BoundedWork: Sendable {
    /// Thrown when the backlog is full, or when a check waited past `maximumWait` for its turn.
    struct Busy: Error {}

    private let queues: [DispatchQueue]
    private let next = Atomic<Int>(0)
    private let pending = Atomic<Int>(0)
    let maximumPending: Int
    let maximumWait: Duration?
    private let now: @Sendable () -> ContinuousClock.Instant
    /// Checks taken and not yet finished (running or waiting).
    var waiting: Int { pending.load(ordering: .relaxed) }

    init(label: String, width: Int = 2, maximumPending: Int = 256, maximumWait: Duration? = nil,
         now: @escaping @Sendable () -> ContinuousClock.Instant = { ContinuousClock.now }) {
        // Serial queues round-robin: exactly `width` checks run at once, the rest wait in order.
        queues = (0..<max(1, width)).map { DispatchQueue(label: "\(label).\($0)") }
        self.maximumPending = maximumPending
        self.maximumWait = maximumWait
        self.now = now
    }

    /// Runs `body` on one of the queues and returns its result, or throws `Busy` (at once when the backlog is full,
    /// or when its turn comes past `maximumWait`).
    func run<T: Sendable, E: Error>(_ body: @escaping @Sendable () throws(E) -> T) async throws -> T {
        guard pending.wrappingAdd(1, ordering: .relaxed).newValue <= maximumPending else {
            pending.wrappingSubtract(1, ordering: .relaxed)
            throw Busy()
        }
        let queue = queues[next.wrappingAdd(1, ordering: .relaxed).newValue % queues.count]
        let deadline = maximumWait.map { now() + $0 }
        let result: Result<T, any Error> = await withCheckedContinuation { continuation in
            queue.async { [self] in
                let outcome: Result<T, any Error>
                if let deadline, now() > deadline {
                    outcome = .failure(Busy())
                } else {
                    outcome = Result { try body() }
                }
                self.pending.wrappingSubtract(1, ordering: .relaxed)
                continuation.resume(returning: outcome)
            }
        }
        return try result.get()
    }
}
