import Clocks
import AppStoreModels
import Foundation

extension AppStoreEmulator {
    /// Adds a sandbox tester or production account (idempotent for the same email and environment).
    @discardableResult
    public func addAccount(email: String, environment: AppStoreEnvironment, storefront: String = "USA", locale: String = "en_US",
                           renewalRate: RenewalRate? = nil, askToBuy: Bool = false, xcode: Bool = false) async throws -> Account {
        let trimmed = email.trimmingCharacters(in: .whitespaces)
        guard trimmed.contains("@"), trimmed.count <= 254, !trimmed.contains(" ") else {
            throw StoreError.invalid("'\(email)' is not an email address.", code: "invalid_email")
        }
        guard Storefront.known.contains(where: { $0.code == storefront }) else {
            throw StoreError.invalid("Unknown storefront \(storefront).", code: "invalid_storefront")
        }
        // Production renews on the calendar; accelerated rates are the sandbox's (and would renew without end there).
        if environment == .production, let renewalRate, renewalRate != .realTime {
            throw StoreError.invalid("Production accounts renew in real time; accelerated rates are for sandbox testers.", code: "invalid_renewal_rate")
        }
        return try await mutate { state, changes, _ in
            let key = trimmed.lowercased()
            if var existing = state.accounts[key] {
                guard existing.environment == environment else {
                    throw StoreError(.conflict, "account_exists", "\(trimmed) is already a \(existing.environment.rawValue) account.")
                }
                existing.storefront = storefront
                existing.locale = locale
                if let renewalRate { existing.renewalRate = renewalRate }
                existing.askToBuy = askToBuy
                existing.xcode = xcode ? true : nil
                existing.deleted = false
                state.accounts[key] = existing
                changes.accounts.insert(key)
                return existing
            }
            state.counters.account += 1
            var account = Account(email: trimmed, environment: environment, storefront: storefront, locale: locale,
                                  renewalRate: renewalRate, askToBuy: askToBuy, identifier: String(1_000_000_000 + state.counters.account))
            account.xcode = xcode ? true : nil
            state.accounts[key] = account
            changes.accounts.insert(key)
            return account
        }
    }

    /// Deletes an account; its receipts then answer 21010.
    public func deleteAccount(email: String) async throws {
        try await mutate { state, changes, _ in
            let key = email.lowercased()
            guard var account = state.accounts[key] else { throw StoreError.notFound("Account \(email)") }
            account.deleted = true
            state.accounts[key] = account
            changes.accounts.insert(key)
        }
    }

    /// Every account.
    public func accounts() async throws -> [Account] {
        try await read { state, _ in state.accounts.values.sorted { $0.email < $1.email } }
    }

    /// Signs a device in to an account (creating the device when `deviceId` is nil or new).
    public func signIn(deviceId: String?, email: String, canMakePayments: Bool = true, buildEnvironment: AppStoreEnvironment? = nil) async throws -> Device {
        if let deviceId, UUIDText.parse(deviceId) == nil {
            throw StoreError.invalid("Device id must be a UUID.", code: "invalid_device_id")
        }
        return try await mutate { state, changes, _ in
            guard let account = state.accounts[email.lowercased()], !account.deleted else { throw StoreError.notFound("Account \(email)") }
            let id = deviceId?.uppercased() ?? ids.next().uuidString
            let device = Device(id: id, accountEmail: account.email, canMakePayments: canMakePayments, buildEnvironment: buildEnvironment)
            state.put(device)
            changes.devices.insert(id)
            return device
        }
    }

    /// The environment of the account a device is signed in to, read without the renewal pass a `read` makes
    /// (every device request asks, for the faults that apply to it).
    func environment(ofDevice id: String) -> AppStoreEnvironment? {
        state.withLock { state in (try? AppStoreEmulator.device(id, in: state))?.1.environment }
    }

    /// One device.
    public func device(_ id: String) async throws -> Device {
        try await read { state, _ in try AppStoreEmulator.device(id, in: state).0 }
    }

    /// The device and its signed-in account, or a StoreKit-style error.
    static func device(_ id: String, in state: EmulatorState) throws -> (Device, Account) {
        guard let device = state.devices[id.uppercased()] else {
            throw StoreError(.notFound, "unknown_device", "Device \(id) is not registered; sign it in first.")
        }
        guard let account = state.accounts[device.accountEmail.lowercased()], !account.deleted else {
            throw StoreError.storeKit(.clientInvalid, "The device is not signed in to an App Store account.", status: .forbidden)
        }
        if let build = device.buildEnvironment, build != account.environment {
            throw StoreError.storeKit(.clientInvalid, "A \(account.environment.rawValue.lowercased()) account cannot buy in the \(build.rawValue.lowercased()) environment; sign in with a \(build == .sandbox ? "sandbox tester" : "production account").", status: .forbidden)
        }
        return (device, account)
    }
}
