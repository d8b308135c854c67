import Foundation

/// Building HTML as text, with every value escaped on the way in. `HTML` is markup that is already safe;
/// a `String` put into it is always escaped.
public struct HTML: Sendable, ExpressibleByStringInterpolation, CustomStringConvertible {
    public private(set) var text: String

    public init(raw text: String) { self.text = text }
    public init(stringLiteral value: String) { text = value }

    public init(stringInterpolation: Interpolation) { text = stringInterpolation.text }

    public struct Interpolation: StringInterpolationProtocol {
        var text = ""
        public init(literalCapacity: Int, interpolationCount: Int) { text.reserveCapacity(literalCapacity * 2) }
        public mutating func appendLiteral(_ literal: String) { text += literal }
        /// A value: escaped.
        public mutating func appendInterpolation(_ value: String) { text += HTML.escape(value) }
        public mutating func appendInterpolation(_ value: Int) { text += String(value) }
        public mutating func appendInterpolation(_ value: Int64) { text += String(value) }
        /// Markup: as it is.
        public mutating func appendInterpolation(_ markup: HTML) { text += markup.text }
        public mutating func appendInterpolation(_ list: [HTML]) { for markup in list { text += markup.text } }
    }

    public var description: String { text }

    public static func escape(_ value: String) -> String {
        var escaped = ""
        escaped.reserveCapacity(value.utf8.count)
        for scalar in value.unicodeScalars {
            switch scalar {
            case "&": escaped += "&amp;"
            case "<": escaped += "&lt;"
            case ">": escaped += "&gt;"
            case "\"": escaped += "&quot;"
            case "'": escaped += "&#39;"
            case "\u{0}": escaped += "\u{FFFD}"
            default: escaped.unicodeScalars.append(scalar)
            }
        }
        return escaped
    }

    /// A path segment or query value, percent-escaped for a URL (then HTML-escaped where it is put).
    public static func urlComponent(_ value: String) -> String {
        value.addingPercentEncoding(withAllowedCharacters: .alphanumerics.union(CharacterSet(charactersIn: "-._~"))) ?? ""
    }

    // MARK: Pieces

    /// A table with a caption, column headers and rows of cells (markup).
    public static func table(caption: String, headers: [String], rows: [[HTML]], empty: String = "Nothing yet.") -> HTML {
        guard !rows.isEmpty else { return "<p class=\"empty\">\(caption): \(empty)</p>" }
        let head = headers.map { header -> HTML in "<th scope=\"col\">\(header)</th>" }
        let body = rows.map { cells -> HTML in "<tr>\(cells.map { cell -> HTML in "<td>\(cell)</td>" })</tr>" }
        return "<div class=\"table\"><table><caption>\(caption)</caption><thead><tr>\(head)</tr></thead><tbody>\(body)</tbody></table></div>"
    }

    /// A labelled input.
    public static func field(_ label: String, name: String, id: String? = nil, type: String = "text", value: String = "", required: Bool = false,
                             attributes: String = "") -> HTML {
        let id = id ?? "f-" + name
        return """
            <div class="field"><label for="\(id)">\(label)</label><input id="\(id)" name="\(name)" type="\(type)" value="\(value)"\
            \(HTML(raw: required ? " required" : ""))\(HTML(raw: attributes.isEmpty ? "" : " " + attributes))></div>
            """
    }

    /// A labelled select of (value, label) options.
    public static func select(_ label: String, name: String, options: [(String, String)], selected: String?) -> HTML {
        let id = "f-" + name
        let items = options.map { value, text -> HTML in
            "<option value=\"\(value)\"\(HTML(raw: value == selected ? " selected" : ""))>\(text)</option>"
        }
        return "<div class=\"field\"><label for=\"\(id)\">\(label)</label><select id=\"\(id)\" name=\"\(name)\">\(items)</select></div>"
    }

    /// A POST form with the session's CSRF token.
    public static func form(action: String, csrf: String, submit: String, danger: Bool = false, _ fields: [HTML] = []) -> HTML {
        """
        <form method="post" action="\(action)"><input type="hidden" name="csrf" value="\(csrf)">\(fields)\
        <button type="submit"\(HTML(raw: danger ? " class=\"danger\"" : ""))>\(submit)</button></form>
        """
    }

    /// A date (Unix ms) as UTC text, `2026-12-01 18:30 UTC`.
    public static func date(_ milliseconds: Int64?) -> String {
        guard let milliseconds else { return "—" }
        var seconds = time_t(milliseconds / 1000)
        var parts = tm()
        guard gmtime_r(&seconds, &parts) != nil else { return String(milliseconds) }
        return String(format: "%04d-%02d-%02d %02d:%02d UTC", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1, Int(parts.tm_mday),
                      Int(parts.tm_hour), Int(parts.tm_min))
    }
}
