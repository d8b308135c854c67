import Foundation
import HTTP
import HTTPServer
import Locking
import PurchaseServer
import Synchronization

/// `storekeeper webhook listen`: a local endpoint to point webhooks at while developing (and the receiver of `make bench`).
struct WebhookListenCommand: Command {
    static let abstract = "A local webhook endpoint: prints each event, checks signatures, counts duplicates; GET /stats for figures."
    static let help = """
    [--port N] [--host ADDRESS] [--secret SECRET] [--fail-first N] [--quiet]

      --port N         Port to listen on (default 8030; 0 picks one).
      --secret SECRET  The endpoint's signing secret: deliveries whose Storekeeper-Signature does not verify are answered 400.
      --fail-first N   Answer 500 to the first N deliveries, to watch the server retry.
      --quiet          Do not print events.

    POST / receives deliveries; GET /stats answers {"received", "unique", "invalidSignatures", "delayP50Ms", "delayP99Ms",
    "firstAt", "lastAt"} (delay: arrival minus the event's occurredAt).
    """
    let host: String
    let port: UInt16
    let secret: String?
    let failFirst: Int
    let quiet: Bool

    init(_ arguments: inout Arguments) throws {
        host = try arguments.option("host") ?? "127.0.0.1"
        guard let port = UInt16(try arguments.option("port") ?? "8030") else { throw UsageError(description: "--port is 0–65535") }
        self.port = port
        secret = try arguments.option("secret")
        guard let failFirst = Int(try arguments.option("fail-first") ?? "0"), failFirst >= 0 else { throw UsageError(description: "--fail-first is a count") }
        self.failFirst = failFirst
        quiet = arguments.flag("quiet")
    }

    func run() async throws {
        let sink = WebhookSink(secret: secret, failFirst: failFirst, quiet: quiet)
        var router = Router()
        router.on(.post, "/") { request in sink.receive(request) }
        router.on(.get, "/stats") { _ in .json(sink.stats()) }
        let server = HTTPServer(configuration: .init(host: host, port: port, accessLog: false), responder: router)
        let bound = try server.start()
        try ShutdownSignal.catch()  // from here a signal stops gracefully (one sent as soon as the address is read is kept)
        say("storekeeper webhook listening on http://\(host):\(bound)/")
        await ShutdownSignal.wait()
        await server.shutdown()
    }
}

/// What the listener has received.
final class WebhookSink: Sendable {
    struct State {
        var received = 0
        var unique: Set<String> = []
        var invalid = 0
        var failuresLeft: Int
        var delays: [Int64] = []
        var first: Int64?
        var last: Int64?
    }

    let secret: String?
    let quiet: Bool
    let state: Locked<State>

    init(secret: String?, failFirst: Int, quiet: Bool) {
        self.secret = secret
        self.quiet = quiet
        state = Locked(State(failuresLeft: failFirst))
    }

    func receive(_ request: HTTP.Request) -> HTTP.Response {
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        let body = Array(request.body)
        if let secret, !WebhookSignature.verify(header: request.header(WebhookSignature.header) ?? "", body: body, secret: secret, now: now / 1000) {
            state.withLock { $0.invalid += 1 }
            return HTTP.Response.json(["error": "invalid signature"], status: HTTPStatus.badRequest)
        }
        let event = (try? JSONSerialization.jsonObject(with: request.body)) as? [String: Any] ?? [:]
        let id = event["id"] as? String ?? ""
        let fail = state.withLock { state -> Bool in
            if state.failuresLeft > 0 {
                state.failuresLeft -= 1
                return true
            }
            state.received += 1
            let fresh = state.unique.insert(id).inserted
            if fresh, let occurred = (event["occurredAt"] as? NSNumber)?.int64Value {
                let (delay, overflow) = now.subtractingReportingOverflow(occurred)
                if !overflow { state.delays.append(delay) }
            }
            state.first = state.first ?? now
            state.last = now
            return false
        }
        if fail { return HTTP.Response.json(["error": "failing on purpose (--fail-first)"], status: HTTPStatus.internalServerError) }
        if !quiet { print("\(event["type"] as? String ?? "?") \(event["app"] as? String ?? "") \(event["appUserId"] as? String ?? "") \(id)") }
        return .json(["ok": true])
    }

    func stats() -> [String: Int64] {
        state.withLock { state in
            let sorted = state.delays.sorted()
            func percentile(_ p: Double) -> Int64 { sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))] }
            return ["received": Int64(state.received), "unique": Int64(state.unique.count), "invalidSignatures": Int64(state.invalid),
                    "delayP50Ms": percentile(0.5), "delayP99Ms": percentile(0.99), "firstAt": state.first ?? 0, "lastAt": state.last ?? 0]
        }
    }
}
