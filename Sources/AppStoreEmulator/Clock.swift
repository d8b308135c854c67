import Foundation
import Locking
import Synchronization

/// Where the emulator reads "now"; injected so renewals and receipts are testable without sleeping.
public protocol EmulatorClock: Sendable {
    /// The current emulator time.
    func now() -> Date
}

/// Wall-clock time shifted by a controllable offset (`time advance`, `time set`).
public final class AdjustableClock: EmulatorClock {
    private let offset: Locked<TimeInterval>
    private let base: @Sendable () -> Date

    /// Creates a clock over `base` (the system clock by default).
    public init(offset: TimeInterval = 0, base: @escaping @Sendable () -> Date = { Date() }) {
        self.offset = Locked(offset)
        self.base = base
    }

    public func now() -> Date { base().addingTimeInterval(offset.withLock { $0 }) }

    /// The current offset from the base clock in seconds.
    public var currentOffset: TimeInterval { offset.withLock { $0 } }

    /// Moves time forward (or back, with a negative interval).
    public func advance(by interval: TimeInterval) { offset.withLock { $0 += interval } }

    /// Jumps to a date.
    public func set(to date: Date) {
        let baseNow = base()
        offset.withLock { $0 = date.timeIntervalSince(baseNow) }
    }
}

/// Durations written as `90s`, `5m`, `1h30m`, `2d`, `1w`, `500ms`.
public enum DurationText {
    /// The longest duration accepted: a century.
    public static let maximum: TimeInterval = 100 * 365.25 * 86400

    /// Seconds for a duration text, or nil (also for anything not finite or longer than `maximum`).
    public static func seconds(_ text: String) -> TimeInterval? {
        guard let seconds = parse(text), seconds.isFinite, abs(seconds) <= maximum else { return nil }
        return seconds
    }

    static func parse(_ text: String) -> TimeInterval? {
        let trimmed = text.trimmingCharacters(in: .whitespaces).lowercased()
        guard !trimmed.isEmpty, trimmed.utf8.count <= 64 else { return nil }
        if let plain = Double(trimmed) { return plain }
        var total = 0.0
        var number = ""
        var index = trimmed.startIndex
        while index < trimmed.endIndex {
            let character = trimmed[index]
            if character.isNumber || character == "." {
                number.append(character)
                index = trimmed.index(after: index)
                continue
            }
            var unit = ""
            while index < trimmed.endIndex, trimmed[index].isLetter {
                unit.append(trimmed[index])
                index = trimmed.index(after: index)
            }
            guard let value = Double(number) else { return nil }
            let scale: Double
            switch unit {
            case "ms": scale = 0.001
            case "s", "sec": scale = 1
            case "m", "min": scale = 60
            case "h": scale = 3600
            case "d": scale = 86400
            case "w": scale = 604_800
            default: return nil
            }
            total += value * scale
            number = ""
        }
        guard number.isEmpty else { return nil }
        return total
    }
}
