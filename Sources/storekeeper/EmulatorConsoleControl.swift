import AppStoreEmulator
import AppStoreModels
import Foundation
import PurchaseServer

/// The console's Emulator page, driving the emulator `storekeeper up` runs in the same process.
struct EmulatorConsoleControl: ConsoleEmulatorControl {
    let emulator: AppStoreEmulator

    func now() async throws -> Date { emulator.clock.now() }
    func advanceTime(seconds: TimeInterval) async throws -> Date { try await emulator.advanceTime(by: seconds) }
    func setTime(_ date: Date) async throws -> Date { try await emulator.setTime(date) }

    func faults() async throws -> [String] {
        try await emulator.faults().map { fault in
            var line = "\(fault.endpoint): \(fault.behavior)"
            if fault.latencyMax > 0 { line += String(format: ", %.0f–%.0f s late", fault.latencyMin, fault.latencyMax) }
            if let until = fault.expiresAt { line += ", until " + ReceiptDate.rfc3339(until) }
            return line
        }
    }

    func addFault(_ fault: ConsoleFault, minutes: Int) async throws {
        let (behavior, latency): (Fault.Behavior, ClosedRange<Double>?) = switch fault {
        case .unavailable: (.http(503), nil)
        case .status21005: (.status(21005), nil)
        case .drop: (.drop, nil)
        case .slow: (.none, 3...6)
        }
        try await emulator.addFault(endpoint: "verifyReceipt", environment: nil, behavior: behavior, latency: latency, duration: Double(minutes) * 60)
    }

    func clearFaults() async throws -> Int { try await emulator.clearFaults() }

    func testers() async throws -> [String] { try await emulator.accounts().map(\.email).sorted() }

    func addTester(email: String) async throws { _ = try await emulator.addAccount(email: email, environment: .sandbox) }

    func products(app: String) async throws -> [String] { try await emulator.app(app).products.map(\.productId).sorted() }

    func buy(app: String, product: String, tester: String) async throws -> String {
        let device = try await AppStoreResponder.device(for: tester, named: nil, emulator)
        _ = try await emulator.addPayment(bundleId: app, deviceId: device, request: PaymentRequest(productId: product))
        guard let receipt = try await emulator.appReceipt(bundleId: app, deviceId: device) else {
            throw CommandFailure(description: "the emulator made no receipt")
        }
        return receipt.base64EncodedString()
    }
}
