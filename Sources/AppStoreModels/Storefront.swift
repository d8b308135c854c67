/// Apple storefronts: alpha-3 code, numeric id and currency.
public enum Storefront {
    /// (alpha-3, storefront id, currency) for the storefronts the emulator knows.
    public static let known: [(code: String, id: String, currency: String)] = [
        ("USA", "143441", "USD"), ("FRA", "143442", "EUR"), ("DEU", "143443", "EUR"), ("GBR", "143444", "GBP"),
        ("CAN", "143455", "CAD"), ("AUS", "143460", "AUD"), ("JPN", "143462", "JPY"), ("HKG", "143463", "HKD"),
        ("CHN", "143465", "CNY"), ("KOR", "143466", "KRW"), ("TWN", "143470", "TWD"),
    ]

    /// The currency of a storefront (USD when unknown).
    public static func currency(for code: String) -> String {
        known.first { $0.code == code }?.currency ?? "USD"
    }

    /// Apple's numeric storefront id (`143441` for USA).
    public static func identifier(for code: String) -> String {
        known.first { $0.code == code }?.id ?? "143441"
    }
}

/// A small slice of App Store Connect's classic price tiers.
public enum PriceTier {
    /// The tiers App Store Connect had (0 is free).
    public static let tiers: ClosedRange<Int> = 0...87

    /// Prices of tier N in USA, JPN and CHN (tier N ≈ N − 0.01 USD).
    public static func prices(tier: Int) -> [ProductPrice] {
        guard tier > 0 else { return [ProductPrice(storefront: "USA", currency: "USD", amount: "0")] }
        let tier = min(tier, tiers.upperBound)
        let usd = "\(tier - 1).99"
        let jpy = String(tier * 120)
        let cny = String(tier * 6)
        return [
            ProductPrice(storefront: "USA", currency: "USD", amount: usd),
            ProductPrice(storefront: "JPN", currency: "JPY", amount: jpy),
            ProductPrice(storefront: "CHN", currency: "CNY", amount: cny),
        ]
    }
}
