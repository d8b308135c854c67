import Foundation

extension Collection where Element == UInt8 {
    /// Whether `other` holds the same bytes, compared by `memcmp` when both are contiguous. `==` and `elementsEqual`
    /// on bytes compare one element at a time, which for a certificate or a JWS header (a few kilobytes, compared on
    /// every receipt or notification) costs microseconds.
    @inlinable
    public func hasSameBytes(as other: some Collection<UInt8>) -> Bool {
        guard count == other.count else { return false }
        let compared = withContiguousStorageIfAvailable { mine in
            other.withContiguousStorageIfAvailable { theirs in
                mine.isEmpty || memcmp(mine.baseAddress!, theirs.baseAddress!, mine.count) == 0
            }
        }
        return (compared ?? nil) ?? elementsEqual(other)
    }
}
