import Foundation

/// A line chart as inline SVG, drawn by the server: one polyline per series over the same x labels, the y axis
/// from zero to the largest value. The numbers are always in a table beside it (the chart is an illustration).
public enum Chart {
    public struct Series: Sendable {
        public var name: String
        public var values: [Double]
        public init(name: String, values: [Double]) {
            self.name = name
            self.values = values
        }
    }

    static let colors = ["#0b57d0", "#b3261e", "#146c2e", "#8a4b00", "#6a1b9a"]

    public static func line(id: String, title: String, labels: [String], series: [Series]) -> HTML {
        let width = 640.0, height = 240.0, left = 56.0, bottom = 28.0, top = 12.0, right = 12.0
        let count = max(labels.count, 1)
        let largest = max(series.flatMap(\.values).filter(\.isFinite).max() ?? 0, 1)
        func x(_ index: Int) -> Double { left + (count == 1 ? 0 : Double(index) / Double(count - 1)) * (width - left - right) }
        func y(_ value: Double) -> Double { top + (1 - (value.isFinite ? max(0, value) : 0) / largest) * (height - top - bottom) }
        var shapes: [HTML] = []
        for step in 0...4 {
            let value = largest * Double(step) / 4
            shapes.append("<line x1=\"\(f(left))\" x2=\"\(f(width - right))\" y1=\"\(f(y(value)))\" y2=\"\(f(y(value)))\" stroke=\"#d0d5dc\"/>")
            shapes.append("<text x=\"\(f(left - 6))\" y=\"\(f(y(value) + 4))\" text-anchor=\"end\" font-size=\"11\" fill=\"#4d5562\">\(short(value))</text>")
        }
        for index in [0, count / 2, count - 1] where index < labels.count {
            shapes.append("<text x=\"\(f(x(index)))\" y=\"\(f(height - 8))\" text-anchor=\"middle\" font-size=\"11\" fill=\"#4d5562\">\(labels[index])</text>")
        }
        for (number, line) in series.enumerated() {
            let points = line.values.enumerated().map { "\(f(x($0.offset))),\(f(y($0.element)))" }.joined(separator: " ")
            shapes.append("<polyline fill=\"none\" stroke=\"\(colors[number % colors.count])\" stroke-width=\"2\" points=\"\(points)\"/>")
        }
        let legend = series.enumerated().map { number, line -> HTML in
            "<span class=\"muted\"><svg class=\"swatch\" width=\"12\" height=\"12\" aria-hidden=\"true\"><rect width=\"12\" height=\"12\" fill=\"\(colors[number % colors.count])\"/></svg> \(line.name)</span> "
        }
        return """
            <figure><svg viewBox="0 0 \(f(width)) \(f(height))" role="img" aria-labelledby="\(id)-title"><title id="\(id)-title">\(title)</title>\(shapes)</svg>\
            <figcaption>\(legend)</figcaption></figure>
            """
    }

    private static func f(_ value: Double) -> String { String(format: "%.1f", value) }

    private static func short(_ value: Double) -> String {
        if value >= 1_000_000 { return String(format: "%.1fM", value / 1_000_000) }
        if value >= 10_000 { return String(format: "%.0fk", value / 1_000) }
        return value == value.rounded() ? String(Int(value)) : String(format: "%.2f", value)
    }
}
