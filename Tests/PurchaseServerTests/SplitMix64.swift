/// SplitMix64: small, fast, and the same on every machine, so a failing seed can be run again.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    mutating func below(_ bound: Int) -> Int { Int(next() % UInt64(max(1, bound))) }
    mutating func below(int64 bound: Int64) -> Int64 { Int64(next() % UInt64(max(1, bound))) }
    mutating func chance(_ percent: Int64) -> Bool { below(int64: 100) < percent }
}
