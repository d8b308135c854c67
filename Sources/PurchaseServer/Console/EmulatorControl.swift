import Foundation

/// What the console's emulator page drives when the purchase server runs beside the App Store emulator
/// (`storekeeper up`): its clock, its faults, its testers, and a purchase as a tester. The emulator module
/// implements it; the purchase server knows only this.
public protocol ConsoleEmulatorControl: Sendable {
    func now() async throws -> Date
    func advanceTime(seconds: TimeInterval) async throws -> Date
    func setTime(_ date: Date) async throws -> Date
    /// The faults in force, one line each.
    func faults() async throws -> [String]
    func addFault(_ fault: ConsoleFault, minutes: Int) async throws
    func clearFaults() async throws -> Int
    func testers() async throws -> [String]
    func addTester(email: String) async throws
    /// The products of an app in the emulator's catalog.
    func products(app: String) async throws -> [String]
    /// Buys as a tester; the app receipt after it (base64).
    func buy(app: String, product: String, tester: String) async throws -> String
}

/// A fault the emulator page can add to verifyReceipt.
public enum ConsoleFault: String, Sendable, CaseIterable {
    case unavailable = "http-503"
    case status21005 = "status-21005"
    case drop
    case slow = "latency-3s-6s"

    public var title: String {
        switch self {
        case .unavailable: "HTTP 503"
        case .status21005: "status 21005 (try again)"
        case .drop: "connection dropped"
        case .slow: "3–6 s of latency"
        }
    }
}
