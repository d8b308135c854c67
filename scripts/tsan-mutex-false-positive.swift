// ThreadSanitizer on Linux does not see Synchronization.Mutex (it does not lock through pthread),
// so every access inside Mutex.withLock is reported as a race. This program has no race and still
// gets reports:  swiftc -sanitize=thread -g scripts/tsan-mutex-false-positive.swift -o /tmp/m && /tmp/m
// This is why the package locks through `Locked<Value>` (Sources/Locking), which `make sanitize`
// builds as a pthread mutex (-DSTOREKEEPER_TSAN) that ThreadSanitizer can see.
import Dispatch
import Synchronization

struct State {
    var count = 0
    var list: [Int] = []
}

final class Box: Sendable {
    let state = Mutex(State())
}

let box = Box()
DispatchQueue.concurrentPerform(iterations: 4) { _ in
    for value in 0..<10_000 { box.state.withLock { $0.count += 1; $0.list.append(value) } }
}
print(box.state.withLock { $0.count })  // always 40000
