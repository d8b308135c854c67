import AppStoreCrypto
import AppStoreModels
import Foundation
import HTTP

/// The emulator's HTTP surface: verifyReceipt (Apple's), the device API and the admin API (ours).
public struct AppStoreResponder: Responder {
    let emulator: AppStoreEmulator
    let router: Router
    /// When set, the admin API needs it as a bearer token (the CA and clock reads excepted).
    let adminToken: String?

    /// Builds the routes over an emulator.
    /// - Parameter tlsRoot: the root of the certificate the emulator serves Apple's host names with, when it does
    ///   (`GET /admin/v1/ca?tls=true` exports it).
    public init(emulator: AppStoreEmulator, adminToken: String? = nil, tlsRoot: Certificate? = nil) {
        self.emulator = emulator
        self.adminToken = adminToken.flatMap { $0.isEmpty ? nil : $0 }
        var router = Router()
        AppStoreResponder.addVerifyReceiptRoutes(&router, emulator)
        AppStoreResponder.addDeviceRoutes(&router, emulator)
        AppStoreResponder.addAdminRoutes(&router, emulator)
        AppStoreResponder.addCertificateRoutes(&router, emulator, tlsRoot: tlsRoot)
        AppStoreResponder.addStoreKitTestingRoutes(&router, emulator)
        AppStoreResponder.addServerAPIRoutes(&router, emulator)
        AppStoreResponder.addStoreKit2Routes(&router, emulator)
        router.on(.get, "/health") { _ in .json(["status": "ok"]) }
        router.on(.get, "/healthz") { _ in .json(["status": "ok"]) }
        // Ready when its state answers (a read goes through the lock and the store).
        router.on(.get, "/readyz") { _ in
            do {
                _ = try await emulator.apps()
                return .json(["ready": true])
            } catch {
                return .json(["ready": false], status: .serviceUnavailable)
            }
        }
        self.router = router
    }

    public func respond(to request: Request) async -> Response {
        let named: Request
        switch served(request) {
        case .success(let served): named = served
        case .failure(let refusal): return refusal.response
        }
        if named.path.hasPrefix("/device/") { return await respondAsDevice(to: named) }
        return await router.respond(to: named)
    }

    /// verifyReceipt is answered on the transport's thread: it computes over memory (the receipt's signature, the state
    /// under its lock, the answer's rendering), and the hand-off to a task and back cost about a quarter of a
    /// one-purchase verification. A fault's latency is held by the transport (`.after`, no task waiting), and its
    /// misbehaviour, or the verification, decided when it is due. A verification whose read found renewals to persist,
    /// a hanging fault and every other route go on as tasks.
    public func respondPromptly(to request: Request) -> PromptAnswer {
        guard request.method == .post, case .success(let named) = served(request),
              let environment = AppStoreResponder.verifyReceiptPaths[named.path] else {
            return .later { await self.respond(to: request) }
        }
        let route = named.path
        @Sendable func routed(_ response: Response) -> Response {
            var response = response
            response.route = route
            return response
        }
        @Sendable func response(_ body: Data) -> Response { routed(.rawJSON(body)) }
        let emulator = self.emulator
        @Sendable func verification() -> PromptAnswer {
            let (answer, aftermath) = emulator.verifyReceiptNow(body: named.body, environment: environment)
            guard let aftermath, !aftermath.isEmpty else { return .now(response(answer)) }
            return .later { response(await AppStoreEmulator.answer(answer, after: aftermath, environment: environment)) }
        }
        // The fault chosen here is the one applied: the request is not routed or a fault chosen a second time.
        guard let fault = emulator.fault(for: "verifyReceipt", environment: environment) else { return verification() }
        if case .hang = fault.behavior {
            return .later { routed(await AppStoreResponder.apply(fault, environment: environment) ?? .drop) }
        }
        // Its latency is held by the transport (no task waits); then the misbehaviour, or the verification then.
        @Sendable func faulted() -> PromptAnswer {
            AppStoreResponder.misbehaviour(of: fault, environment: environment).map { .now(routed($0)) } ?? verification()
        }
        guard let latency = AppStoreResponder.latency(of: fault) else { return faulted() }
        return .after(latency, faulted)
    }

    /// The verifyReceipt path of each environment.
    static let verifyReceiptPaths = Dictionary(uniqueKeysWithValues: AppStoreEnvironment.allCases.map { ("/\($0.pathComponent)/verifyReceipt", $0) })

    /// The request as the routes see it: Apple's host names mapped onto the emulator's paths, or a refusal.
    func served(_ request: Request) -> Result<Request, HTTPError> {
        var request = request
        // Through a tunnel only Apple's names are served: a Host of 127.0.0.1 (or none) inside it must not
        // reach the admin or device API behind the proxy's back.
        if request.tunnel != nil, !(request.host.map(AppleHosts.all.contains) ?? false) {
            return .failure(HTTPError(HTTPStatus(421), code: "misdirected_request",
                                      message: "Through the proxy only Apple's App Store hosts are served; this request names \(request.host ?? "no host")."))
        }
        // Apple's hosts (reached through the proxy or a hosts entry) serve paths without an environment;
        // the Host header picks it. Nothing else is served under Apple's names: the admin API stays on loopback names.
        if let host = request.host, AppleHosts.all.contains(host) {
            if let environment = AppleHosts.verifyReceipt[host], request.path == "/verifyReceipt" {
                request.path = "/\(environment.pathComponent)/verifyReceipt"
            } else if let environment = AppleHosts.serverAPI[host], request.path.hasPrefix("/inApps/") {
                request.path = "/\(environment.pathComponent)" + request.path
            } else if host == AppleHosts.ocsp {
                // POST to the responder's path; GET (RFC 6960) puts the request after it, Base64 that may hold '/'.
                let segments = request.path.split(separator: "/", maxSplits: 1, omittingEmptySubsequences: true)
                request.path = request.method == .get && segments.count == 2
                    ? "/ocsp/" + segments[1].replacingOccurrences(of: "/", with: "%2F") : "/ocsp"
            } else {
                return .failure(HTTPError(.notFound, code: "not_found", message: "\(host) serves no \(request.path) here."))
            }
        }
        return .success(request)
    }

    /// Applies a matching fault: latency first, then the misbehaviour (nil means answer normally).
    static func applyFault(_ emulator: AppStoreEmulator, endpoint: String, environment: AppStoreEnvironment?) async -> Response? {
        guard let fault = emulator.fault(for: endpoint, environment: environment) else { return nil }
        return await apply(fault, environment: environment)
    }

    /// Applies a fault already chosen: its latency, then its misbehaviour (nil means answer normally).
    static func apply(_ fault: Fault, environment: AppStoreEnvironment?) async -> Response? {
        if let latency = latency(of: fault) { await HeldCalls.shared.hold(for: latency) }
        if case .hang = fault.behavior {
            // Hold the request until the server shuts down (which cancels this task), then drop it.
            while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
        }
        return misbehaviour(of: fault, environment: environment)
    }

    /// A fault's latency this time: a fixed value or a draw from its range (nil when it has none).
    static func latency(of fault: Fault) -> Duration? {
        guard fault.latencyMax > 0 else { return nil }
        let seconds = Double.random(in: fault.latencyMin...max(fault.latencyMin, fault.latencyMax))
        return .milliseconds(Int(seconds * 1000))
    }

    /// What a fault answers instead of the endpoint (nil: answer normally); a hang's end (`apply` holds it first).
    static func misbehaviour(of fault: Fault, environment: AppStoreEnvironment?) -> Response? {
        switch fault.behavior {
        case .none:
            return nil
        case .hang:
            return .drop
        case .status(let code):
            var body: [String: Any] = ["status": code]
            if let environment { body["environment"] = environment.rawValue }
            if VerifyReceiptStatus.isInternalRange(code) { body["is_retryable"] = code != 21199 }
            let data = (try? JSONSerialization.data(withJSONObject: body, options: [.sortedKeys])) ?? Data()
            return .rawJSON(data)
        case .http(let code):
            return Response(status: HTTPStatus(code), headers: ["Content-Type": "text/plain"], body: Data("Service Unavailable".utf8))
        case .html:
            return .text("<html><head><title>Apple</title></head><body><h1>We're sorry.</h1><p>The service is temporarily unavailable.</p></body></html>",
                         contentType: "text/html; charset=utf-8")
        case .drop:
            return .drop
        }
    }

    static func addVerifyReceiptRoutes(_ router: inout Router, _ emulator: AppStoreEmulator) {
        for environment in AppStoreEnvironment.allCases {
            let path = "/\(environment.pathComponent)/verifyReceipt"
            router.on(.post, path) { request in
                if let faulted = await applyFault(emulator, endpoint: "verifyReceipt", environment: environment) { return faulted }
                return .rawJSON(await emulator.verifyReceipt(body: request.body, environment: environment))
            }
            for method in [HTTPMethod.get, .put, .delete] {
                router.on(method, path) { _ in
                    .rawJSON(Data("{\"environment\":\"\(environment.rawValue)\",\"status\":21000}".utf8))
                }
            }
        }
    }
}

/// Maps emulator errors to the JSON error shape, adding the SKError StoreKit would raise.
func errorResponse(_ error: any Error) -> Response {
    switch error {
    case let error as StoreError:
        var detail: [String: Any] = ["code": error.code, "message": error.message]
        if let sk = error.skError {
            detail["skErrorCode"] = sk.rawValue
            detail["skError"] = sk.name
        }
        if let simulated = error.storeKitError {
            detail["storeKitError"] = simulated.rawValue
            detail["storeKitErrorType"] = simulated.family.typeName
        }
        let body = (try? JSONSerialization.data(withJSONObject: ["error": detail], options: [.sortedKeys])) ?? Data()
        return Response(status: error.status, headers: ["Content-Type": "application/json"], body: body)
    case let error as HTTPError:
        return error.response
    default:
        return HTTPError(.internalServerError, code: "internal_error", message: "The emulator failed: \(type(of: error)).").response
    }
}

/// Runs a handler, turning thrown errors into JSON error responses.
func handle(_ body: () async throws -> Response) async -> Response {
    do { return try await body() } catch { return errorResponse(error) }
}

extension Request {
    /// A required query or body parameter.
    func required(_ name: String) throws -> String {
        guard let value = query[name], !value.isEmpty else {
            throw StoreError.invalid("Missing parameter '\(name)'.", code: "missing_parameter")
        }
        return value
    }
}
