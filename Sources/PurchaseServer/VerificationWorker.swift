import Clocks
import Foundation
import Locking
import Synchronization

/// Runs verification jobs: claims due jobs in batches and keeps up to `concurrency` of them in
/// flight at once (Apple takes seconds per call, so thousands may wait on the network together).
/// Woken by new jobs in this process, by NOTIFY from other processes, and by a poll timer.
public final class VerificationWorker: Sendable {
    public struct Configuration: Sendable {
        /// Jobs in flight at once.
        public var concurrency: Int
        /// Jobs claimed per query.
        public var batchSize: Int
        /// How long a claim lasts before another worker may take the job over.
        public var lease: TimeInterval
        /// Poll interval when nothing wakes the worker.
        public var pollInterval: Duration

        public init(concurrency: Int = 2048, batchSize: Int = 128, lease: TimeInterval = 120, pollInterval: Duration = .milliseconds(500)) {
            self.concurrency = concurrency
            self.batchSize = batchSize
            self.lease = lease
            self.pollInterval = pollInterval
        }
    }

    let engine: VerificationEngine
    let configuration: Configuration
    /// This worker's lease owner id.
    public let owner: String
    let signal = WakeSignal()
    private let state: Locked<WorkerPlaces>
    private let settled: @Sendable (String) -> Void
    /// What the worker's concurrency is now, when it follows the process's free descriptors (`follow(capacity:)`).
    private let capacitySource = Locked<CapacitySource?>(nil)

    /// The source, boxed in a class: kept bare in `Mutex<(@Sendable () -> Int)?>`, each `withLock { $0 }` wrote the
    /// closure back through its `inout` wrapped in two more reabstraction thunks (`() -> @out Int` and back), so the
    /// stored closure grew by two frames per read and every call walked them all (a server spent 45% of its CPU there).
    /// A class reference is stored as it is.
    private final class CapacitySource: Sendable {
        let allowed: @Sendable () -> Int
        init(_ allowed: @escaping @Sendable () -> Int) { self.allowed = allowed }
    }

    /// Creates a worker; `settled` is told the id of every job it settles.
    public init(engine: VerificationEngine, configuration: Configuration, ids: any IDGenerator = RandomIDs(),
                settled: @escaping @Sendable (String) -> Void) {
        self.engine = engine
        self.configuration = configuration
        state = Locked(WorkerPlaces(capacity: configuration.concurrency))
        owner = "worker-\(ProcessInfo.processInfo.processIdentifier)-\(ids.nextString().prefix(8))"
        self.settled = settled
    }

    /// Has the worker's concurrency follow `capacity`, asked before each place is given: the calls to Apple a process
    /// may keep in flight depend on how many descriptors its clients hold now. At most `configuration.concurrency`.
    public func follow(capacity: @escaping @Sendable () -> Int) {
        let source = CapacitySource(capacity)
        capacitySource.withLock { $0 = source }
    }

    /// The concurrency now: `configuration.concurrency`, or less when it follows a source that allows less.
    public var capacity: Int {
        guard let source = capacitySource.withLock({ $0 }) else { return configuration.concurrency }
        return max(1, min(configuration.concurrency, source.allowed()))
    }

    /// Runs `body` on the places, their capacity first set to what the source allows now (asked outside the lock).
    private func withCurrentPlaces<Result>(_ body: (inout WorkerPlaces) -> Result) -> Result {
        let capacity = self.capacity
        return state.withLock { state in
            state.capacity = capacity
            return body(&state)
        }
    }

    /// Jobs currently being verified by this worker.
    public var inFlight: Int { state.withLock { $0.inFlight } }

    /// The worker's places now.
    var places: WorkerPlaces { state.withLock { $0 } }

    /// Whether `run()` is running.
    public var isRunning: Bool { state.withLock { $0.running } }

    /// Asks the worker to look for jobs now.
    public func wake() { signal.wake() }

    /// Runs until the task is cancelled.
    public func run() async {
        state.withLock { $0.running = true }
        let database = engine.store.database
        // Other processes' new jobs arrive by NOTIFY (PostgreSQL only; an SQLite file has one process).
        let listener = Task { [signal] in
            while !Task.isCancelled && database.dialect == .postgres {
                await database.wait(for: PurchaseStore.jobsChannel, timeout: .seconds(5))
                signal.wake()
            }
        }
        defer { listener.cancel() }
        var claimFailureSaid: ContinuousClock.Instant?
        while !Task.isCancelled {
            var claimed = 0
            if let claim = withCurrentPlaces({ $0.beginClaim(batch: configuration.batchSize) }) {
                var found: Int?
                var jobs: [VerificationJob] = []
                do {
                    (jobs, found) = try await engine.store.claimCounting(owner: owner, limit: claim.asked, lease: configuration.lease,
                                                                        now: engine.clock.now())
                } catch {
                    // The jobs stay for the next claim (the database unreachable, a statement refused): said once a minute.
                    if claimFailureSaid.map({ ContinuousClock.now - $0 >= .seconds(60) }) ?? true {
                        claimFailureSaid = ContinuousClock.now
                        FileHandle.standardError.write(Data("storekeeper: claiming verification jobs failed: \(error)\n".utf8))
                    }
                }
                claimed = jobs.count
                state.withLock { $0.endClaim(claim, found: found, started: jobs.count) }
                for job in jobs { start(job) }
            }
            let hasRoom = state.withLock { state -> Bool in
                publishRoom(state)
                return state.hasRoom
            }
            if claimed == configuration.batchSize && hasRoom { continue }
            await signal.wait(timeout: configuration.pollInterval)
        }
        state.withLock { state in
            state.running = false
            publishRoom(state)
        }
    }

    /// Writes a new job with `write` and has it verified. With a free place, and no job left waiting in the queue
    /// (see `WorkerPlaces.backlog`), the place is reserved, the job written already claimed under this worker's lease
    /// and started once committed: no claim statement, no second read of its receipt. Otherwise it is written pending
    /// (a nil lease), behind the waiting jobs, and the worker is woken to claim it.
    func takeUpload(now: Date, _ write: (VerificationJob.Lease?) async throws -> VerificationJob) async throws -> VerificationJob {
        guard let lease = reserve(now: now) else {
            let job = try await write(nil)
            wake()
            return job
        }
        let job: VerificationJob
        do {
            job = try await write(lease)
        } catch {
            // Not written, or (the commit's answer lost) written with a lease that lapses and is taken over.
            giveBack()
            throw error
        }
        handOver(job)
        return job
    }

    /// Reserves a place for a job this process is about to write, and the lease to write it under; nil when the
    /// worker is stopped or full, or jobs may be waiting in the queue (the job is then written pending and the worker
    /// woken). A reservation ends in `handOver` once the job committed, or in `giveBack` when none was written (or the
    /// commit's answer was lost: the lease lapses and the job is taken over).
    func reserve(now: Date) -> VerificationJob.Lease? {
        let reserved = withCurrentPlaces { state -> Bool in
            defer { publishRoom(state) }
            return state.reserve()
        }
        return reserved ? VerificationJob.Lease(owner: owner, expiresAt: now.addingTimeInterval(configuration.lease)) : nil
    }

    /// Starts a job written under a lease from `reserve`, in its reserved place. `inspected` is its signed
    /// transaction as this process already verified it (a notification's), which the engine then does not check again.
    func handOver(_ job: VerificationJob, inspected: VerificationEngine.InspectedTransaction? = nil) {
        start(job, inspected: inspected)
    }

    /// Gives back a place reserved by `reserve` for a job that was not written.
    func giveBack() { finishOne() }

    /// Verifies a job in a place already counted in `inFlight`, and frees the place when it ends.
    private func start(_ job: VerificationJob, inspected: VerificationEngine.InspectedTransaction? = nil) {
        // By reference, the receipt's text split off (see `ClaimedJob`): the task holds 8 bytes while Apple answers.
        let claimed = VerificationEngine.ClaimedJob(job, inspected: inspected)
        Task {
            let outcome = await self.engine.process(claimed, owner: self.owner)
            self.finishOne()
            if outcome?.isSettled == true { self.settled(claimed.id) }
        }
    }

    /// Frees a place. A free place matters only to a worker that stopped claiming for want of one; waking it after
    /// every job would run a claim per job.
    private func finishOne() {
        let wasFull = state.withLock { state -> Bool in
            defer { publishRoom(state) }
            return state.free()
        }
        if wasFull { signal.wake() }
    }

    /// Tells the store whether this worker takes new jobs itself (running, with a free place), so that they wake no
    /// other process (`PurchaseStore.localWorkerHasRoom`). Called under the state's lock: a job that ends after the
    /// worker stopped cannot say it takes them.
    private func publishRoom(_ state: WorkerPlaces) {
        engine.store.localWorkerHasRoom.store(state.takesNewJobs, ordering: .relaxed)
    }

    /// Waits (up to `timeout`) for jobs in flight to finish.
    public func drain(timeout: Duration) async {
        let deadline = ContinuousClock.now.advanced(by: timeout)
        while inFlight > 0 && ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(20)) }
    }
}

/// Lets HTTP handlers wait for a job to settle (`?wait=`), woken by this process's worker.
public final class SettlementWaiters: Sendable {
    private let waiters = Locked<[String: [CheckedContinuation<Void, Never>]]>([:])

    public init() {}

    /// Wakes everyone waiting for `id`.
    public func settled(_ id: String) {
        let list = waiters.withLock { $0.removeValue(forKey: id) ?? [] }
        for waiter in list { waiter.resume() }
    }

    /// Waits until `id` is reported settled or `timeout` passes.
    public func wait(for id: String, timeout: Duration) async {
        let timer = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            self?.settled(id)
        }
        await withCheckedContinuation { continuation in
            waiters.withLock { $0[id, default: []].append(continuation) }
        }
        timer.cancel()
    }
}
