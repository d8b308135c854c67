import Foundation
import Locking
import Synchronization

/// The purchase server's counters and histograms, in memory per process, rendered in the Prometheus
/// text format by `GET /metrics` together with gauges read from the database at scrape time. Label
/// values are bounded (route templates, not paths; status codes; a fixed set of outcomes), so a hostile
/// client cannot grow the set of series.
public final class ServerMetrics: Sendable {
    /// Latency buckets in seconds, from a millisecond to Apple's worst days.
    static let latencyBuckets: [Double] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30]
    /// Notification lag buckets in seconds: Apple delivers within seconds, retries over hours.
    static let lagBuckets: [Double] = [0.1, 0.5, 1, 5, 30, 60, 300, 3600, 86400]

    struct Histogram: Sendable {
        var buckets: [Double]
        var counts: [Int]
        var sum = 0.0
        var count = 0

        init(_ buckets: [Double]) {
            self.buckets = buckets
            counts = Array(repeating: 0, count: buckets.count)
        }

        mutating func observe(_ value: Double) {
            for index in buckets.indices where value <= buckets[index] { counts[index] += 1 }
            sum += value.isFinite ? value : 0
            count += 1
        }
    }

    private struct State: Sendable {
        var requests: [[String]: Int] = [:]
        var requestLatency: [[String]: Histogram] = [:]
        var appleCalls: [[String]: Int] = [:]
        var appleLatency: [[String]: Histogram] = [:]
        var notificationLag = Histogram(ServerMetrics.lagBuckets)
        var notifications: [[String]: Int] = [:]
        var webhookAttempts: [[String]: Int] = [:]
        var webhookLatency = Histogram(ServerMetrics.latencyBuckets)
    }

    private let state = Locked(State())

    public init() {}

    /// One HTTP request answered: its route template (`/v1/users/:user`), method and status.
    func request(route: String, method: String, status: Int, seconds: Double) {
        state.withLock { state in
            state.requests[[route, method, String(status)], default: 0] += 1
            state.requestLatency[[route, method], default: Histogram(Self.latencyBuckets)].observe(seconds)
        }
    }

    /// A request refused at the HTTP edge: counted, not timed (anyone can send refusals, and their instant answers
    /// would pull a route's latency down and hide its slow answers).
    func refusal(route: String, method: String, status: Int) {
        state.withLock { state in state.requests[[route, method, String(status)], default: 0] += 1 }
    }

    /// One call to Apple: `verifyReceipt` or a Server API path template, the environment, and how it ended.
    func appleCall(endpoint: String, environment: String, outcome: String, seconds: Double) {
        state.withLock { state in
            state.appleCalls[[endpoint, environment, outcome], default: 0] += 1
            state.appleLatency[[endpoint, environment], default: Histogram(Self.latencyBuckets)].observe(seconds)
        }
    }

    /// What became of a notification received (or `refused` when its envelope was not Apple's).
    func notification(outcome: String) {
        state.withLock { $0.notifications[[outcome], default: 0] += 1 }
    }

    /// How long after Apple signed a notification it arrived (a validly signed one).
    func notificationLag(seconds: Double) {
        state.withLock { $0.notificationLag.observe(max(0, seconds)) }
    }

    /// One webhook delivery attempt.
    func webhookAttempt(outcome: String, seconds: Double) {
        state.withLock { state in
            state.webhookAttempts[[outcome], default: 0] += 1
            state.webhookLatency.observe(seconds)
        }
    }

    /// A gauge read at scrape time.
    struct Gauge {
        var name: String
        var help: String
        var labels: [String] = []
        var samples: [([String], Double)]
        /// `gauge`, or `counter` for a total read from elsewhere when rendered.
        var type = "gauge"
    }

    /// Everything, in the Prometheus text exposition format (version 0.0.4).
    func render(gauges: [Gauge]) -> String {
        let snapshot = state.withLock { $0 }
        var text = PrometheusText()
        text.counter("storekeeper_http_requests_total", "HTTP requests answered, by route template, method and status.",
                     labels: ["route", "method", "status"], snapshot.requests)
        text.histograms("storekeeper_http_request_duration_seconds", "Time to answer an HTTP request.", labels: ["route", "method"],
                        snapshot.requestLatency)
        text.counter("storekeeper_apple_calls_total", "Calls to the App Store, by endpoint, environment and outcome.",
                     labels: ["endpoint", "environment", "outcome"], snapshot.appleCalls)
        text.histograms("storekeeper_apple_call_duration_seconds", "Time the App Store took to answer.", labels: ["endpoint", "environment"],
                        snapshot.appleLatency)
        text.counter("storekeeper_notifications_total", "App Store Server Notifications received, by outcome.", labels: ["outcome"],
                     snapshot.notifications)
        text.histograms("storekeeper_notification_lag_seconds", "Time from a notification's signedDate to its arrival.", labels: [],
                        [[]: snapshot.notificationLag])
        text.counter("storekeeper_webhook_attempts_total", "Webhook delivery attempts, by outcome.", labels: ["outcome"], snapshot.webhookAttempts)
        text.histograms("storekeeper_webhook_attempt_duration_seconds", "Time a webhook endpoint took to answer.", labels: [],
                        [[]: snapshot.webhookLatency])
        for gauge in gauges { text.gauge(gauge) }
        return text.output
    }
}

/// Writes the Prometheus text format.
struct PrometheusText {
    var output = ""

    static func escape(_ value: String) -> String {
        value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"").replacingOccurrences(of: "\n", with: "\\n")
    }

    static func labels(_ names: [String], _ values: [String], extra: (String, String)? = nil) -> String {
        var pairs = zip(names, values).map { "\($0)=\"\(escape($1))\"" }
        if let extra { pairs.append("\(extra.0)=\"\(extra.1)\"") }
        return pairs.isEmpty ? "" : "{" + pairs.joined(separator: ",") + "}"
    }

    static func number(_ value: Double) -> String {
        if value == value.rounded(), abs(value) < 1e15 { return String(Int64(value)) }
        return String(value)
    }

    mutating func header(_ name: String, _ help: String, _ type: String) {
        output += "# HELP \(name) \(help)\n# TYPE \(name) \(type)\n"
    }

    mutating func counter(_ name: String, _ help: String, labels: [String], _ values: [[String]: Int]) {
        header(name, help, "counter")
        for (key, value) in values.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            output += "\(name)\(Self.labels(labels, key)) \(value)\n"
        }
    }

    mutating func histograms(_ name: String, _ help: String, labels: [String], _ values: [[String]: ServerMetrics.Histogram]) {
        header(name, help, "histogram")
        for (key, histogram) in values.sorted(by: { $0.key.lexicographicallyPrecedes($1.key) }) {
            for (bound, count) in zip(histogram.buckets, histogram.counts) {
                output += "\(name)_bucket\(Self.labels(labels, key, extra: ("le", Self.number(bound)))) \(count)\n"
            }
            output += "\(name)_bucket\(Self.labels(labels, key, extra: ("le", "+Inf"))) \(histogram.count)\n"
            output += "\(name)_sum\(Self.labels(labels, key)) \(histogram.sum)\n"
            output += "\(name)_count\(Self.labels(labels, key)) \(histogram.count)\n"
        }
    }

    mutating func gauge(_ gauge: ServerMetrics.Gauge) {
        header(gauge.name, gauge.help, gauge.type)
        for (values, value) in gauge.samples { output += "\(gauge.name)\(Self.labels(gauge.labels, values)) \(Self.number(value))\n" }
    }
}

extension AppleAnswer {
    /// The outcome label of a verifyReceipt call: `status_0`, `status_21007`, …, or the retry's kind.
    var metricOutcome: String {
        switch self {
        case .answered(let response, _): "status_\(response.status)"
        case .retryable(let retry): retry.kind.rawValue
        }
    }
}

extension Duration {
    /// In seconds, as a Double.
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
