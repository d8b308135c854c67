/// A verification worker's places, as a value: the jobs it has in flight against its concurrency, whether it runs,
/// and whether jobs may be waiting in the queue, which decides whether an upload is handed to it or queued.
struct WorkerPlaces: Equatable {
    /// Jobs in flight at once (the worker's concurrency).
    let capacity: Int
    /// Jobs being verified, and places reserved for uploads being written.
    private(set) var inFlight = 0
    var running = false
    /// Whether jobs may be waiting in the queue: written while the worker refused them a place, or before it started.
    /// Uploads are then queued too, behind them, until a claim finds fewer jobs than it asked for. Handed over, they
    /// would take every place that frees up while the worker is full, and the queue would wait as long as uploads
    /// kept coming.
    private(set) var backlog = true
    /// Uploads refused a place so far: a claim clears `backlog` only if none was refused while it ran (one refused
    /// then may have been written after the claim looked).
    private(set) var refusals = 0

    init(capacity: Int) { self.capacity = capacity }

    var hasRoom: Bool { inFlight < capacity }

    /// Whether the worker takes the jobs uploaded to this process itself (handed over or claimed), so that no other
    /// process need be woken for them.
    var takesNewJobs: Bool { running && hasRoom }

    /// Whether an upload would be handed over now (`reserve()`).
    var takesUploads: Bool { running && !backlog && hasRoom }

    /// Reserves a place for an upload to be handed over; false (the upload is queued, and later ones behind it) when
    /// the worker is stopped, full, or jobs may be waiting in the queue.
    mutating func reserve() -> Bool {
        guard takesUploads else {
            refusals += 1
            backlog = true
            return false
        }
        inFlight += 1
        return true
    }

    /// Counts `count` jobs claimed by a claim that asked for `asked`, begun when `refusals` was `refusalsAtStart`.
    mutating func claimed(_ count: Int, of asked: Int, refusalsAtStart: Int) {
        inFlight += count
        if count < asked && refusals == refusalsAtStart { backlog = false }
    }

    /// Frees a place (a job ended, or a reserved upload was not written); returns whether the worker was full.
    mutating func free() -> Bool {
        defer { inFlight -= 1 }
        return inFlight >= capacity
    }
}
