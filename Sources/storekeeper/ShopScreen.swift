import Foundation
import StoreKitClient
#if canImport(Glibc)
import Glibc
#endif

/// The interactive shop: the store's products with prices and state, keys to buy, restore and refresh,
/// and a status line (loading, purchasing, waiting for Ask to Buy, verifying, errors).
struct ShopScreen {
    let shop: Shop
    let title: String
    let identifiers: [String]
    var rows: [ShopRow] = []
    var status = "loading…"
    var offline = false

    init(shop: Shop, title: String, identifiers: [String]) {
        self.shop = shop
        self.title = title
        self.identifiers = identifiers
    }

    mutating func run() async {
        let terminal = RawTerminal()
        defer { terminal.restore() }
        render()
        if let resumed = try? await shop.resume(), !resumed.isEmpty {
            status = "resumed \(resumed.count) unfinished order(s)"
        }
        await refresh()
        while true {
            render()
            guard let key = await terminal.readKey() else { return }
            switch key {
            case "q", "Q", "\u{3}", "\u{4}":
                return
            case "r", "R":
                status = "restoring purchases…"
                render()
                do {
                    let verdict = try await shop.restore()
                    status = verdict.map { "restored (\($0.state))" } ?? "nothing to restore"
                } catch {
                    status = "restore failed: \(error)"
                }
                await refresh(keepStatus: true)
            case "f", "F":
                status = "refreshing…"
                render()
                await refresh()
            default:
                guard let digit = Int(String(key)), digit >= 1, digit <= rows.count else {
                    status = "keys: 1–\(rows.count) buy, r restore, f refresh, q quit"
                    continue
                }
                let product = rows[digit - 1]
                status = "purchasing \(product.title)…"
                render()
                do {
                    let order = try await shop.buy(product.productId)
                    switch order.state {
                    case .finished: status = "thank you! \(product.title) delivered"
                    case .deferred: status = "waiting for Ask to Buy: a parent must approve \(product.title)"
                    case .cancelled: status = "cancelled"
                    default: status = "\(product.title): \(order.state.rawValue) \(order.lastError ?? "")"
                    }
                } catch let error as ServerUnavailable {
                    status = "verifying later (server unreachable): \(error.message)"
                } catch {
                    status = "error: \(error)"
                }
                await refresh(keepStatus: true)
            }
        }
    }

    mutating func refresh(keepStatus: Bool = false) async {
        do {
            (rows, offline) = try await shop.rows(identifiers)
            if !keepStatus { status = offline ? "offline: showing what this device delivered" : "ready" }
        } catch {
            status = "cannot reach the App Store: \(error)"
        }
    }

    func render() {
        var screen = "\u{1B}[2J\u{1B}[H"
        screen += "  \(title)\r\n\r\n"
        for (index, row) in rows.enumerated() {
            var state = row.type == "consumable" ? "bought \(row.count)" : (row.owned ? "owned" : "")
            if row.owned, let expires = row.expiresDate {
                state += " until " + ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double(expires) / 1000))
            }
            let name = row.title.padding(toLength: 28, withPad: " ", startingAt: 0)
            let price = row.price.padding(toLength: 10, withPad: " ", startingAt: 0)
            screen += "  [\(index + 1)] \(name) \(price) \(state)\r\n"
        }
        screen += "\r\n  1–\(max(1, rows.count)) buy   r restore   f refresh   q quit\r\n"
        screen += "  status: \(status)\r\n"
        FileHandle.standardOutput.write(Data(screen.utf8))
    }
}

/// Puts the terminal in raw mode (one key at a time, no echo) and back.
final class RawTerminal: @unchecked Sendable {
    private var saved = termios()
    private let active: Bool

    init() {
        active = isatty(0) == 1 && tcgetattr(0, &saved) == 0
        guard active else { return }
        var raw = saved
        raw.c_lflag &= ~tcflag_t(ICANON | ECHO)
        tcsetattr(0, TCSANOW, &raw)
    }

    func restore() {
        if active { tcsetattr(0, TCSANOW, &saved) }
        FileHandle.standardOutput.write(Data("\r\n".utf8))
    }

    /// The next key, read off the cooperative pool; nil at end of input.
    func readKey() async -> Character? {
        await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                var byte: UInt8 = 0
                let count = read(0, &byte, 1)
                continuation.resume(returning: count == 1 ? Character(Unicode.Scalar(byte)) : nil)
            }
        }
    }
}
