import Foundation
import FuzzTargets

// One binary for every harness, chosen by FUZZ_TARGET. Built by `make fuzz` with
// -sanitize=fuzzer,address -DFUZZING: libFuzzer's driver runs the harness. Built normally, it
// replays files (`storekeeper-fuzz TARGET FILE...`), which is how a crash is reproduced.

/// The harness named by FUZZ_TARGET (libFuzzer owns the command line).
let selected: FuzzTargets.Harness? = ProcessInfo.processInfo.environment["FUZZ_TARGET"].flatMap { FuzzTargets.all[$0] }

#if FUZZING
@_silgen_name("LLVMFuzzerRunDriver")
func LLVMFuzzerRunDriver(_ argc: UnsafeMutablePointer<CInt>, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?>,
                         _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt) -> CInt

/// libFuzzer's entry for one input (also referenced by its own main, which SwiftPM's entry point replaces).
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    selected?(data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? [])
    return 0
}

/// SwiftPM links `main` to this symbol; it hands the command line to libFuzzer's driver.
@_cdecl("storekeeper_fuzz_main")
func fuzzMain(_ argc: CInt, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> CInt {
    guard selected != nil else {
        FileHandle.standardError.write(Data("set FUZZ_TARGET to one of: \(FuzzTargets.all.keys.sorted().joined(separator: ", "))\n".utf8))
        return 2
    }
    var count = argc
    var vector = argv
    return LLVMFuzzerRunDriver(&count, &vector, fuzzOneInput)
}
#else
@main
struct Replay {
    static func main() {
        let arguments = Array(CommandLine.arguments.dropFirst())
        guard let name = arguments.first, let harness = FuzzTargets.all[name] else {
            print("usage: storekeeper-fuzz TARGET FILE...   (targets: \(FuzzTargets.all.keys.sorted().joined(separator: ", ")))")
            exit(2)
        }
        for path in arguments.dropFirst() {
            guard let data = FileManager.default.contents(atPath: path) else { continue }
            harness(Array(data))
            print("ok \(path)")
        }
    }
}
#endif
