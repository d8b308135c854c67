import Foundation
import Clocks
import Locking

/// Holds tasks for a fault's latency (the device and Server API endpoints; verifyReceipt's latency is held by the HTTP
/// server, `PromptAnswer.after`): one thread and one heap of wake-up times for every held call of the process
/// (`Alarms`). `Task.sleep` arms a Dispatch timer source per call: an emulator holding thousands of calls for 3–6 s
/// spent 4.3% of its CPU on those timers (bench/README.md, twentieth round). Cancelling the waiting task ends its wait
/// at once, as `Task.sleep` does.
final class HeldCalls: Sendable {
    static let shared = HeldCalls()

    private let alarms = Alarms(name: "storekeeper-held-calls")

    init() {}

    /// Calls held now (for tests).
    var count: Int { alarms.count }

    /// Whether the thread runs (for tests): it ends when nothing is held.
    var threadRunning: Bool { alarms.threadRunning }

    /// Returns after `duration`, or at once when the task is cancelled.
    func hold(for duration: Duration) async {
        guard duration > .zero else { return }
        // The alarm's id once scheduled, and whether the task was cancelled (either may come first).
        let wait = Locked<(alarm: UInt64?, cancelled: Bool)>((nil, false))
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let alarm = alarms.schedule(after: duration) { continuation.resume() }
                if wait.withLock({ wait -> Bool in
                    wait.alarm = alarm
                    return wait.cancelled
                }) { alarms.fireNow(alarm) }
            }
        } onCancel: {
            if let alarm = wait.withLock({ wait -> UInt64? in
                wait.cancelled = true
                return wait.alarm
            }) { alarms.fireNow(alarm) }
        }
    }
}
