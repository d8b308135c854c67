import Clocks
import Foundation
@testable import PurchaseServer
import Testing

/// The sweep of verified jobs' receipts as a rule: where each pass starts and stops, and how long it waits.
@Suite("Receipt sweep")
struct ReceiptSweepTests {
    @Test("The bound of a moment sorts above every ordered id made before its millisecond and below every one made from it")
    func orderedBound() {
        let moment = Date(timeIntervalSince1970: 1_796_650_000)
        #expect(RandomIDs.orderedBound(moment) == "01a250af-5e80")  // 1,796,650,000,000 ms in 48 bits of hex
        let ids = RandomIDs()
        let made = ids.nextOrderedString()
        #expect(made < RandomIDs.orderedBound(Date().addingTimeInterval(1)))
        #expect(made > RandomIDs.orderedBound(Date().addingTimeInterval(-1)))
        #expect(RandomIDs.orderedBound(Date(timeIntervalSince1970: 0)) == "00000000-0000")
    }

    @Test("On SQLite: a pass a second below the bound of ten seconds ago, on from where the last ended; once a minute the whole table")
    func sqliteRule() {
        var sweep = ReceiptSweep(bounded: true)
        #expect(sweep.firstWait == .seconds(1))
        let start = ContinuousClock.now
        // The first pass: from the first id, below the bound.
        let first = sweep.next(now: start, bound: "b1")
        #expect(first == .init(after: "", before: "b1"))
        #expect(sweep.finished(first, dropped: 10, last: "x") == .seconds(1))
        // The next starts at the bound (everything verified below it was dropped).
        let second = sweep.next(now: start + .seconds(1), bound: "b2")
        #expect(second == .init(after: "b1", before: "b2"))
        // A full pass goes on from its last id after 0.1 s, with the bound of then.
        #expect(sweep.finished(second, dropped: ReceiptSweep.limit, last: "a5") == .milliseconds(100))
        let third = sweep.next(now: start + .seconds(2), bound: "b3")
        #expect(third == .init(after: "a5", before: "b3"))
        #expect(sweep.finished(third, dropped: 2, last: "a7") == .seconds(1))
        // A minute after the first: the whole table from the first id, without a bound, a thousand at a time to its end.
        let whole = sweep.next(now: start + .seconds(61), bound: "b4")
        #expect(whole == .init(after: "", before: nil))
        #expect(sweep.finished(whole, dropped: ReceiptSweep.limit, last: "c1") == .milliseconds(100))
        let rest = sweep.next(now: start + .seconds(62), bound: "b5")
        #expect(rest == .init(after: "c1", before: nil))
        #expect(sweep.finished(rest, dropped: 3, last: "c2") == .seconds(1))
        // Then bounded passes again, from where they stood (the bound of their last pass), not from the first id.
        #expect(sweep.next(now: start + .seconds(63), bound: "b6") == .init(after: "b3", before: "b6"))
    }

    @Test("Elsewhere: a look every minute for receipts an earlier version kept, a thousand at a time")
    func otherRule() {
        var sweep = ReceiptSweep(bounded: false)
        #expect(sweep.firstWait == .seconds(60))
        let start = ContinuousClock.now
        let first = sweep.next(now: start, bound: "b1")
        #expect(first == .init(after: "", before: nil))
        #expect(sweep.finished(first, dropped: ReceiptSweep.limit, last: "a9") == .milliseconds(100))
        let second = sweep.next(now: start, bound: "b2")
        #expect(second == .init(after: "a9", before: nil))
        #expect(sweep.finished(second, dropped: 0, last: nil) == .seconds(60))
        #expect(sweep.next(now: start + .seconds(60), bound: "b3") == .init(after: "", before: nil))
    }
}
