/// A verification worker's places, as a value: the jobs it has in flight against its concurrency, whether it runs,
/// and whether jobs may be waiting in the queue, which decides whether an upload is handed to it or queued.
struct WorkerPlaces: Equatable {
    /// Jobs in flight at once (the worker's concurrency). It may fall below `inFlight` (the process's clients took
    /// the descriptors): no place is then free until enough jobs end.
    var capacity: Int
    /// Jobs being verified, and places reserved for uploads being written.
    private(set) var inFlight = 0
    /// Places held by the claim running (at most one at a time).
    private(set) var claiming = 0
    var running = false
    /// Whether jobs may be waiting in the queue because the worker turned uploads away (full or stopped), or had not
    /// claimed yet since it started. Uploads are then queued too, behind them, until a claim finds fewer due jobs than
    /// it asked for. Handed over, they would take every place that frees up while the worker is full, and the queue
    /// would wait as long as uploads came.
    ///
    /// An upload turned away just before a claim may be committed after the claim looked: later uploads can pass it
    /// until the claim its commit wakes takes it, which happens at once while a place is free (and with none free,
    /// the next upload is turned away again).
    private(set) var backlog = true
    /// Uploads turned away for want of a place so far: a claim clears `backlog` only if none was while it ran.
    private(set) var turnedAway = 0

    init(capacity: Int) { self.capacity = capacity }

    var hasRoom: Bool { inFlight + claiming < capacity }

    /// Whether the worker takes the jobs uploaded to this process itself (handed over or claimed), so that no other
    /// process need be woken for them.
    var takesNewJobs: Bool { running && hasRoom }

    /// Whether an upload would be handed over now (`reserve()`).
    var takesUploads: Bool { takesNewJobs && !backlog }

    /// Reserves a place for an upload to be handed over; false (the upload is queued) when the worker is stopped,
    /// full, or jobs may be waiting in the queue.
    mutating func reserve() -> Bool {
        guard takesNewJobs else {
            turnedAway += 1
            backlog = true
            return false
        }
        guard !backlog else { return false }
        inFlight += 1
        return true
    }

    /// A claim in progress: the places it holds and what `turnedAway` was when it began.
    struct Claim: Equatable {
        let asked: Int
        let turnedAwayAtStart: Int
    }

    /// Reserves the places of a claim of up to `batch` jobs, so that uploads handed over meanwhile cannot take them;
    /// nil when no place is free.
    mutating func beginClaim(batch: Int) -> Claim? {
        let asked = min(capacity - inFlight - claiming, batch)
        guard asked > 0 else { return nil }
        claiming += asked
        return Claim(asked: asked, turnedAwayAtStart: turnedAway)
    }

    /// Ends a claim that found `found` due jobs (nil: it failed) and started `started` of them (the others were
    /// poison), giving back the places it did not use.
    mutating func endClaim(_ claim: Claim, found: Int?, started: Int) {
        claiming -= claim.asked
        inFlight += started
        if let found, found < claim.asked, turnedAway == claim.turnedAwayAtStart { backlog = false }
    }

    /// Frees a place (a job ended, or a reserved upload was not written); returns whether the worker was full.
    mutating func free() -> Bool {
        defer { inFlight -= 1 }
        return !hasRoom
    }
}
