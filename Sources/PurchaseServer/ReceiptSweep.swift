import Foundation

/// Where each pass of the sweep of verified jobs' receipts starts and stops, and how long it waits before the next:
/// the rule the background task in `PurchaseServer.runWorker` follows (`PurchaseStore.dropSettledReceipts`).
///
/// On SQLite (`bounded`) settlement leaves a verified job's receipt to this sweep (`JobRepository.closeSettled`): a pass
/// every second drops those among the ids made before `bound` (ten seconds ago, when nearly every job uploaded then has
/// settled), from where the last pass ended, so each receipt is looked at about once; once a minute a pass starts from
/// the first id with no bound, for jobs that settled after the cursor passed them (retried, replayed) and ids not
/// ordered by time. Elsewhere settlement drops its receipts itself, and the sweep only looks every minute for receipts
/// an earlier version kept. A pass that drops `limit` is followed by the next after 0.1 s.
struct ReceiptSweep: Equatable {
    static let limit = 1_000
    static let fromStartEvery: Duration = .seconds(60)

    struct Pass: Equatable {
        var after: String
        var before: String?
    }

    let bounded: Bool
    private(set) var cursor = ""
    /// The current pass started from the first id without a bound, and has not reached the end yet.
    private(set) var wholeTable = false
    /// When the last pass from the first id started (nil: none yet).
    private(set) var lastFromStart: ContinuousClock.Instant?
    /// Where the bounded passes stood when the whole table's pass began: they go on from there after it.
    private(set) var resume = ""

    init(bounded: Bool) {
        self.bounded = bounded
    }

    /// How long to wait before the first pass.
    var firstWait: Duration { bounded ? .seconds(1) : Self.fromStartEvery }

    /// The next pass at `now`, with `bound` the ordered-id bound of ten seconds ago.
    mutating func next(now: ContinuousClock.Instant, bound: String) -> Pass {
        guard bounded else { return Pass(after: cursor, before: nil) }
        if !wholeTable, let last = lastFromStart, now - last >= Self.fromStartEvery {
            (wholeTable, resume, cursor, lastFromStart) = (true, cursor, "", now)
        }
        if lastFromStart == nil { lastFromStart = now }
        return Pass(after: cursor, before: wholeTable ? nil : bound)
    }

    /// What `pass` dropped; returns how long to wait before the next.
    mutating func finished(_ pass: Pass, dropped: Int, last: String?) -> Duration {
        if dropped >= Self.limit, let last {
            cursor = last
            return .milliseconds(100)
        }
        if let before = pass.before {
            cursor = before
        } else {
            (cursor, wholeTable) = (bounded ? resume : "", false)
        }
        return bounded ? .seconds(1) : Self.fromStartEvery
    }
}
