import Foundation

/// Apple's date encodings: RFC 3339 in binary receipts, and the three verifyReceipt forms
/// (`Etc/GMT`, milliseconds as a string, `America/Los_Angeles` local time).
public enum ReceiptDate {
    private static let pacific = TimeZone(identifier: "America/Los_Angeles") ?? TimeZone(secondsFromGMT: -8 * 3600)!

    /// Integer Unix milliseconds of a date, saturating: a date outside what Int64 milliseconds can
    /// hold (or not finite) never traps, whatever a request or file put in it.
    public static func milliseconds(_ date: Date) -> Int64 {
        saturating((date.timeIntervalSince1970 * 1000).rounded(.down))
    }

    /// Whole Unix seconds of a date, saturating like `milliseconds`.
    static func seconds(_ date: Date) -> Int64 {
        saturating(date.timeIntervalSince1970.rounded(.down))
    }

    /// `value` as Int64, clamped to its range (NaN is 0).
    static func saturating(_ value: Double) -> Int64 {
        if let exact = Int64(exactly: value) { return exact }
        if value.isNaN { return 0 }
        return value < 0 ? .min : .max
    }

    /// The first instant accepted from a client: 1970-01-01T00:00:00Z.
    public static let earliestAccepted = Date(timeIntervalSince1970: 0)
    /// The last instant accepted from a client: 9999-12-31T23:59:59.999Z.
    public static let latestAccepted = Date(timeIntervalSince1970: 253_402_300_799.999)

    /// Whether `date` lies in 1970…9999, the span the server accepts from requests and settings.
    public static func isAccepted(_ date: Date) -> Bool { date >= earliestAccepted && date <= latestAccepted }

    /// A date from Unix milliseconds.
    public static func date(milliseconds: Int64) -> Date {
        Date(timeIntervalSince1970: Double(milliseconds) / 1000)
    }

    /// `2013-08-01 07:00:00 Etc/GMT`
    public static func gmtString(_ date: Date) -> String {
        civil(seconds: seconds(date), separator: 32, suffix: " Etc/GMT")
    }

    /// `2013-08-01 00:00:00 America/Los_Angeles` (follows daylight saving time).
    public static func pacificString(_ date: Date) -> String {
        let seconds = seconds(date)
        return civil(seconds: seconds &+ pacificOffset(seconds), separator: 32, suffix: " America/Los_Angeles")
    }

    /// UTC offset of Los Angeles. Since 2007 US daylight time runs from the second Sunday of March,
    /// 02:00 local (10:00 UTC), to the first Sunday of November, 02:00 local (09:00 UTC); computing it
    /// directly is much faster than asking the time zone database, which older dates still use.
    static func pacificOffset(_ seconds: Int64) -> Int64 {
        let (year, _, _) = civilFromDays(seconds >= 0 ? seconds / 86400 : (seconds &- 86399) / 86400)
        return pacificOffset(seconds, year: year)
    }

    /// `pacificOffset(seconds)` when the UTC year of `seconds` is already known.
    static func pacificOffset(_ seconds: Int64, year: Int64) -> Int64 {
        guard year >= 2007 else { return Int64(pacific.secondsFromGMT(for: Date(timeIntervalSince1970: Double(seconds)))) }
        let (start, end) = year < 2007 + Int64(daylightTimes.count) ? daylightTimes[Int(year - 2007)] : daylightTime(year: year)
        return seconds >= start && seconds < end ? -7 * 3600 : -8 * 3600
    }

    /// When daylight time starts and ends (UTC seconds) in the years 2007…2199, worked out once: verifyReceipt asks for
    /// every date of every purchase it answers with.
    private static let daylightTimes: [(start: Int64, end: Int64)] = (2007...2199).map { daylightTime(year: Int64($0)) }

    /// When daylight time starts and ends in `year` (from 2007).
    private static func daylightTime(year: Int64) -> (start: Int64, end: Int64) {
        func sunday(month: Int, nth: Int) -> Int64 {
            let firstDay = daysFromCivil(year: Int(year), month: month, day: 1)
            let weekday = ((firstDay % 7) + 11) % 7  // 0 = Sunday (1970-01-01 was a Thursday)
            return firstDay + (7 - weekday) % 7 + Int64(7 * (nth - 1))
        }
        return (sunday(month: 3, nth: 2) * 86400 + 10 * 3600, sunday(month: 11, nth: 1) * 86400 + 9 * 3600)
    }

    /// `2013-08-01T07:00:00Z`, as binary receipts store dates.
    public static func rfc3339(_ date: Date) -> String {
        civil(seconds: seconds(date), separator: 84, suffix: "Z")
    }

    /// Parses RFC 3339 with `Z`, `±HH:MM` or `±HHMM` offsets and optional fractions; nil for empty or invalid text.
    public static func parseRFC3339(_ text: String) -> Date? {
        Array(text.utf8).withUnsafeBufferPointer { parseRFC3339(utf8: $0) }
    }

    /// `parseRFC3339` on the UTF-8 bytes themselves (a receipt's IA5String), without making a String first.
    public static func parseRFC3339(utf8 bytes: UnsafeBufferPointer<UInt8>) -> Date? {
        guard bytes.count >= 19 else { return nil }
        func number(_ range: Range<Int>) -> Int? {
            var value = 0
            for index in range {
                guard bytes[index] >= 48, bytes[index] <= 57 else { return nil }
                value = value * 10 + Int(bytes[index] - 48)
            }
            return value
        }
        guard let year = number(0..<4), bytes[4] == 45, let month = number(5..<7), bytes[7] == 45,
              let day = number(8..<10), bytes[10] == 84 || bytes[10] == 32, let hour = number(11..<13), bytes[13] == 58,
              let minute = number(14..<16), bytes[16] == 58, let second = number(17..<19),
              (1...12).contains(month), (1...31).contains(day), hour < 24, minute < 60, second < 61 else { return nil }
        var index = 19
        var fraction = 0.0
        if index < bytes.count, bytes[index] == 46 {
            index += 1
            var scale = 0.1
            while index < bytes.count, bytes[index] >= 48, bytes[index] <= 57 {
                fraction += Double(bytes[index] - 48) * scale
                scale /= 10
                index += 1
            }
        }
        var offset = 0
        if index < bytes.count {
            let sign = bytes[index]
            if sign == 90 || sign == 122 {
                index += 1
            } else if sign == 43 || sign == 45 {
                let rest = Array(bytes[(index + 1)...])
                let digits = rest.filter { $0 != 58 }
                guard digits.count == 4, digits.allSatisfy({ $0 >= 48 && $0 <= 57 }) else { return nil }
                let hours = Int(digits[0] - 48) * 10 + Int(digits[1] - 48)
                let minutes = Int(digits[2] - 48) * 10 + Int(digits[3] - 48)
                offset = (hours * 3600 + minutes * 60) * (sign == 45 ? -1 : 1)
                index = bytes.count
            } else {
                return nil
            }
        }
        guard index == bytes.count else { return nil }
        let days = daysFromCivil(year: year, month: month, day: day)
        let seconds = days * 86400 + Int64(hour * 3600 + minute * 60 + second) - Int64(offset)
        return Date(timeIntervalSince1970: Double(seconds) + fraction)
    }

    /// Formats Unix seconds as `YYYY-MM-DD<separator>HH:MM:SS<suffix>`, written digit by digit into one buffer: verifyReceipt
    /// writes three forms of every date of every purchase, and joining small strings cost more than the rest of a date.
    static func civil(seconds: Int64, separator: UInt8, suffix: StaticString) -> String {
        guard let time = CivilTime(seconds: seconds) else { return unusualCivil(seconds: seconds, separator: separator, suffix: suffix) }
        let length = CivilTime.length + suffix.utf8CodeUnitCount
        return String(unsafeUninitializedCapacity: length) { buffer in
            time.write(separator: separator, into: buffer)
            suffix.withUTF8Buffer { tail in
                for index in 0..<tail.count { buffer[CivilTime.length + index] = tail[index] }
            }
            return length
        }
    }

    /// A year outside 0…9999 (a saturated date): every field written in full.
    private static func unusualCivil(seconds: Int64, separator: UInt8, suffix: StaticString) -> String {
        let time = CivilTime(unboundedSeconds: seconds)
        let text = String(time.year) + "-" + String(time.month) + "-" + String(time.day)
        return text + String(decoding: [separator], as: UTF8.self) + "\(time.hour):\(time.minute):\(time.second)" + suffix.description
    }

    /// The calendar fields of a UTC instant.
    struct CivilTime {
        /// `YYYY-MM-DD HH:MM:SS`
        static let length = 19
        var year, month, day, hour, minute, second: Int64

        init(unboundedSeconds seconds: Int64) {
            var days = RecentDays()
            self.init(unboundedSeconds: seconds, days: &days)
        }

        /// With the calendar dates of recent days remembered in `days`.
        init(unboundedSeconds seconds: Int64, days recent: inout RecentDays) {
            var days = seconds / 86400
            var remainder = seconds % 86400
            if remainder < 0 { remainder += 86400; days -= 1 }
            (year, month, day) = recent.date(days)
            hour = remainder / 3600
            minute = (remainder % 3600) / 60
            second = remainder % 60
        }

        /// Nil for years outside 0…9999, which do not fit four digits.
        init?(seconds: Int64) {
            var days = RecentDays()
            self.init(seconds: seconds, days: &days)
        }

        /// Nil for years outside 0…9999, with the calendar dates of recent days remembered in `days`.
        init?(seconds: Int64, days: inout RecentDays) {
            self.init(unboundedSeconds: seconds, days: &days)
            guard (0...9999).contains(year) else { return nil }
        }

        /// Writes `YYYY-MM-DD<separator>HH:MM:SS` at `buffer[0..<19]`.
        func write(separator: UInt8, into buffer: UnsafeMutableBufferPointer<UInt8>) {
            func two(_ value: Int64, at index: Int) {
                buffer[index] = UInt8(truncatingIfNeeded: 48 + value / 10)
                buffer[index + 1] = UInt8(truncatingIfNeeded: 48 + value % 10)
            }
            two(year / 100, at: 0)
            two(year % 100, at: 2)
            buffer[4] = 45
            two(month, at: 5)
            buffer[7] = 45
            two(day, at: 8)
            buffer[10] = separator
            two(hour, at: 11)
            buffer[13] = 58
            two(minute, at: 14)
            buffer[16] = 58
            two(second, at: 17)
        }
    }

    /// The calendar dates of the last two days asked for: a receipt's dates fall on few days, and each is written in
    /// UTC and in Pacific time (often the day before), so most dates of an answer need no calendar arithmetic.
    struct RecentDays {
        private var latest: (day: Int64, date: (Int64, Int64, Int64)) = (.min, (0, 0, 0))
        private var previous: (day: Int64, date: (Int64, Int64, Int64)) = (.min, (0, 0, 0))

        /// `civilFromDays(day)`.
        mutating func date(_ day: Int64) -> (Int64, Int64, Int64) {
            if day == latest.day { return latest.date }
            if day != previous.day { previous = (day, ReceiptDate.civilFromDays(day)) }
            swap(&latest, &previous)
            return latest.date
        }
    }

    // Howard Hinnant's civil-from-days and days-from-civil algorithms (public domain arithmetic).
    static func civilFromDays(_ days: Int64) -> (Int64, Int64, Int64) {
        let z = days + 719468
        let era = (z >= 0 ? z : z - 146096) / 146097
        let doe = z - era * 146097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365
        let y = yoe + era * 400
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (m <= 2 ? y + 1 : y, m, d)
    }

    static func daysFromCivil(year: Int, month: Int, day: Int) -> Int64 {
        let y = Int64(month <= 2 ? year - 1 : year)
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let m = Int64(month)
        let doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + Int64(day) - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }
}
