// A value behind a lock, for the whole package.
//
// In every normal build this is `Synchronization.Mutex` itself (a typealias: no cost, no change).
// ThreadSanitizer on Linux cannot see `Mutex`, which locks with futexes rather than through pthread,
// so it reports every access inside `withLock` as a race (scripts/tsan-mutex-false-positive.swift).
// `make sanitize` builds with `-DSTOREKEEPER_TSAN`, where the same API is served by a pthread mutex
// that ThreadSanitizer intercepts, so its reports are about our code, not about the lock.

#if STOREKEEPER_TSAN
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The sanitizer build's lock: a pthread mutex guarding a value, with `Mutex`'s `withLock`.
public final class Locked<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    private var value: Value

    public init(_ initialValue: consuming sending Value) {
        value = initialValue
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    public func withLock<Result: ~Copyable, E: Error>(_ body: (inout sending Value) throws(E) -> sending Result) throws(E) -> sending Result {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
#else
import Synchronization

/// A value behind a lock: `Synchronization.Mutex` (see the file's comment for the sanitizer build).
public typealias Locked<Value: ~Copyable> = Mutex<Value>
#endif
