import Foundation
import Locking
import Synchronization

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
