@testable import AppStoreEmulator
import AppStoreModels
import Foundation
import Testing

@Suite("The emulator's state: its indexes of transactions")
struct EmulatorStateTests {
    @Test("Whether an account holds a subscription follows inserts, replacements, state changes and removals; a record is listed once")
    func subscriptionIndex() async throws {
        let world = try await World.make()
        let coins = try await world.buy("com.example.coins", "Nada.JPYF01")
        let magazine = try await world.buy("com.example.magazine", "com.example.magazine.free")
        let monthly = try await world.buy("com.example.magazine", "com.example.magazine.monthly")
        let account = World.tester.uppercased()  // looked up by any case of the email
        func holds(_ state: EmulatorState, _ bundle: String = "com.example.magazine") -> Bool {
            state.hasPurchasedSubscription(account: account, bundle: bundle, environment: .sandbox)
        }
        func listed(_ state: EmulatorState) -> [String] {
            state.transactions(account: account, bundle: "com.example.magazine", environment: .sandbox).map(\.id)
        }

        var state = EmulatorState()
        state.insert(coins)
        state.insert(magazine)
        #expect(!holds(state) && !holds(state, "com.example.coins"))
        state.insert(monthly)
        #expect(holds(state) && !holds(state, "com.example.coins"))
        #expect(!state.hasPurchasedSubscription(account: account, bundle: "com.example.magazine", environment: .production))

        // Written again, changed: listed once, in its place.
        var refunded = monthly
        refunded.state = .failed
        state.update(refunded)
        #expect(listed(state) == [magazine.id, monthly.id])
        #expect(!holds(state))
        state.update(monthly.id) { $0.state = .purchased }  // changed in place, as refunds and renewals are
        #expect(holds(state))

        // Moved to another account: gone from the first one's lists.
        var moved = monthly
        moved.accountEmail = "other@example.com"
        state.insert(moved)
        #expect(!holds(state) && listed(state) == [magazine.id])
        #expect(state.hasPurchasedSubscription(account: "other@example.com", bundle: "com.example.magazine", environment: .sandbox))

        state.insert(monthly)
        state.remove(monthly.id)
        #expect(!holds(state) && listed(state) == [magazine.id])
        state.remove(magazine.id)
        #expect(listed(state).isEmpty)
    }
}
