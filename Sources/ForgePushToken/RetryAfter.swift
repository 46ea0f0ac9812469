// Reading an HTTP `Retry-After` field value (RFC 9110 §10.2.3) for UploadOutcome.

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// Reads a `Retry-After` field value: `delay-seconds / HTTP-date` (RFC 9110 §10.2.3).
///
/// Written here because Foundation's HTTP date parsing (`Date.HTTPFormatStyle`) is newer than
/// the package's minimum versions on Apple platforms; the date itself is assembled by Foundation's
/// Gregorian `Calendar` in GMT, so only the tokenising is ours. Pure functions; thread-safe.
@available(iOS 16, macOS 13, tvOS 16, watchOS 9, *)
enum RetryAfter {
    /// The longest delay read: a day. A server asking for more is read as a day (the policy's
    /// ``PushTokenManager/UploadRetryPolicy/maximumRequestedDelay`` caps it far below that).
    static let longest: Int64 = 86_400

    /// The delay `field` asks for, measured from `now` for an HTTP-date; `nil` when the value is
    /// neither form, or is a date not after `now` (the caller then uses its backoff).
    static func delay(_ field: String, now: Date) -> Duration? {
        let value = field.trimmingBlanks
        guard !value.isEmpty else { return nil }
        if value.utf8.allSatisfy({ (0x30...0x39).contains($0) }) {
            var seconds: Int64 = 0
            for digit in value.utf8 {
                seconds = min(seconds * 10 + Int64(digit - 0x30), longest)
            }
            return .seconds(seconds)
        }
        guard let date = httpDate(value, now: now) else { return nil }
        let seconds = date.timeIntervalSince(now)
        guard seconds > 0 else { return nil }
        return .milliseconds(Int64((min(seconds, Double(longest)) * 1000).rounded(.up)))
    }

    private static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    private static let shortDays: Set<Substring> = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    private static let longDays: Set<Substring> = [
        "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday",
    ]

    /// An HTTP-date in any of its three forms (RFC 9110 §5.6.7), or `nil`:
    /// - IMF-fixdate: `Sun, 06 Nov 1994 08:49:37 GMT`;
    /// - obsolete RFC 850: `Sunday, 06-Nov-94 08:49:37 GMT` (a two-digit year more than 50 years
    ///   after `now` is read as the most recent past year with those digits);
    /// - obsolete asctime: `Sun Nov  6 08:49:37 1994`.
    static func httpDate(_ text: String, now: Date) -> Date? {
        let parts = text.split(separator: " ", omittingEmptySubsequences: true)
        switch parts.count {
        case 6:  // IMF-fixdate
            guard parts[0].hasSuffix(","), shortDays.contains(parts[0].dropLast()), parts[1].count == 2,
                parts[3].count == 4, parts[5] == "GMT"
            else { return nil }
            return date(year: parts[3], month: parts[2], day: parts[1], time: parts[4])
        case 4:  // RFC 850
            let dayMonthYear = parts[1].split(separator: "-", omittingEmptySubsequences: false)
            guard parts[0].hasSuffix(","), longDays.contains(parts[0].dropLast()), parts[3] == "GMT",
                dayMonthYear.count == 3, dayMonthYear[0].count == 2, dayMonthYear[2].count == 2,
                let twoDigits = number(dayMonthYear[2])
            else { return nil }
            let thisYear = gmtCalendar.component(.year, from: now)
            var year = thisYear - thisYear % 100 + twoDigits
            if year > thisYear + 50 { year -= 100 }
            return date(year: Substring(String(year)), month: dayMonthYear[1], day: dayMonthYear[0], time: parts[2])
        case 5:  // asctime
            guard shortDays.contains(parts[0]), parts[2].count <= 2, parts[4].count == 4 else { return nil }
            return date(year: parts[4], month: parts[1], day: parts[2], time: parts[3])
        default:
            return nil
        }
    }

    private static let gmtCalendar: Calendar = {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(secondsFromGMT: 0)!
        return calendar
    }()

    /// The GMT date of the given fields, or `nil` when any is malformed or out of range (such as
    /// 30 February).
    private static func date(year: Substring, month: Substring, day: Substring, time: Substring) -> Date? {
        let clock = time.split(separator: ":", omittingEmptySubsequences: false)
        guard let monthIndex = months.firstIndex(where: { $0 == month }), clock.count == 3,
            clock.allSatisfy({ $0.count == 2 }), let year = number(year), let day = number(day),
            let hour = number(clock[0]), let minute = number(clock[1]), let second = number(clock[2]),
            (1...31).contains(day), hour < 24, minute < 60, second < 61
        else { return nil }
        let components = DateComponents(
            year: year, month: monthIndex + 1, day: day, hour: hour, minute: minute, second: min(second, 59))
        guard let date = gmtCalendar.date(from: components),
            gmtCalendar.component(.day, from: date) == day
        else { return nil }
        return date
    }

    /// The value of one to four ASCII digits, or `nil`.
    private static func number(_ digits: Substring) -> Int? {
        guard (1...4).contains(digits.utf8.count), digits.utf8.allSatisfy({ (0x30...0x39).contains($0) }) else {
            return nil
        }
        return Int(digits)
    }
}

extension String {
    /// The text without the spaces and tabs around it (RFC 9110's OWS).
    fileprivate var trimmingBlanks: String {
        let bytes = utf8.drop { $0 == 0x20 || $0 == 0x09 }.reversed().drop { $0 == 0x20 || $0 == 0x09 }
        return String(decoding: bytes.reversed(), as: UTF8.self)
    }
}
