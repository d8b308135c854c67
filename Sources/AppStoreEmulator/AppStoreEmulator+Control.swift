import Clocks
import AppStoreModels
import Foundation

extension AppStoreEmulator {
    /// Adds a fault; `duration` limits how long it applies.
    @discardableResult
    public func addFault(endpoint: String, environment: AppStoreEnvironment?, behavior: Fault.Behavior,
                         latency: ClosedRange<Double>? = nil, duration: TimeInterval? = nil) async throws -> Fault {
        guard Fault.endpoints.contains(where: { $0.caseInsensitiveCompare(endpoint) == .orderedSame }) else {
            throw StoreError.invalid("Unknown endpoint '\(endpoint)'; use one of \(Fault.endpoints.joined(separator: ", ")).", code: "invalid_endpoint")
        }
        if case .status(let code) = behavior, ![21002, 21005, 21009, 21010].contains(code) && !VerifyReceiptStatus.isInternalRange(code) {
            throw StoreError.invalid("Status faults are 21002, 21005, 21009, 21010 or 21100–21199.", code: "invalid_status")
        }
        if case .http(let code) = behavior, !(400...599).contains(code) {
            throw StoreError.invalid("HTTP faults are 400–599.", code: "invalid_http_status")
        }
        if let latency, latency.lowerBound < 0 || latency.upperBound > 600 {
            throw StoreError.invalid("Latency must be between 0 and 600 seconds.", code: "invalid_latency")
        }
        return try await mutate { state, changes, now in
            let fault = Fault(id: ids.nextString(), endpoint: endpoint, environment: environment, behavior: behavior,
                              latencyMin: latency?.lowerBound ?? 0, latencyMax: latency?.upperBound ?? 0,
                              expiresAt: duration.map { now.addingTimeInterval($0) })
            state.faults[fault.id] = fault
            changes.faults.insert(fault.id)
            return fault
        }
    }

    /// Removes every fault (or those of one endpoint).
    @discardableResult
    public func clearFaults(endpoint: String? = nil) async throws -> Int {
        try await mutate { state, changes, _ in
            let doomed = state.faults.values.filter { endpoint == nil || $0.endpoint.caseInsensitiveCompare(endpoint!) == .orderedSame }
            for fault in doomed {
                state.faults[fault.id] = nil
                changes.deletedFaults.insert(fault.id)
            }
            return doomed.count
        }
    }

    /// The faults in force.
    public func faults() async throws -> [Fault] {
        try await read { state, now in state.faults.values.filter { $0.expiresAt.map { $0 > now } ?? true }.sorted { $0.id < $1.id } }
    }

    /// A fault that covers a call; when several do, one at random, so faults can be mixed
    /// (an outage of 21005, 503, HTML and drops together).
    func fault(for endpoint: String, environment: AppStoreEnvironment?) -> Fault? {
        state.withLock { state in
            // The clock is read only when there is a fault to ask (most calls find none).
            guard !state.faults.isEmpty else { return nil }
            let now = clock.now()
            return state.faults.values.filter { $0.applies(to: endpoint, environment: environment, at: now) }.randomElement()
        }
    }

    /// The quirk switches.
    public func quirks() async throws -> Quirks { try await read { state, _ in state.quirks } }

    /// Changes the quirk switches.
    public func setQuirks(_ quirks: Quirks) async throws {
        guard (1...100).contains(quirks.sandboxMaxRenewals) else {
            throw StoreError.invalid("sandboxMaxRenewals must be 1–100.", code: "invalid_quirks")
        }
        try await mutate { state, changes, _ in
            state.quirks = quirks
            changes.settings = true
        }
    }

    /// Moves emulator time forward; renewals that fall due are created.
    @discardableResult
    public func advanceTime(by seconds: TimeInterval) async throws -> Date {
        guard seconds >= 0 else { throw StoreError.invalid("Time only moves forward; use time set to jump.", code: "invalid_duration") }
        guard seconds.isFinite, ReceiptDate.isAccepted(clock.now().addingTimeInterval(seconds)) else {
            throw StoreError.invalid("Time stays within 1970–9999.", code: "invalid_duration")
        }
        clock.advance(by: seconds)
        return try await persistClock()
    }

    /// Sets emulator time.
    @discardableResult
    public func setTime(_ date: Date) async throws -> Date {
        guard ReceiptDate.isAccepted(date) else { throw StoreError.invalid("Time stays within 1970–9999.", code: "invalid_time") }
        clock.set(to: date)
        return try await persistClock()
    }

    private func persistClock() async throws -> Date {
        let offset = clock.currentOffset
        return try await mutate { state, changes, now in
            state.clockOffset = offset
            changes.settings = true
            return now
        }
    }
}
