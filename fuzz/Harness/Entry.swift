import Foundation

// The process's entry point (fuzz/README.md, "Build"). SwiftPM builds an executable target with an
// entry point of its own (it renames `main` so that tests can link the module), so the harness
// has one in both of its builds:
// - the fuzzer (`-D FORGE_REQUEST_FUZZER` with `-sanitize=fuzzer,address`, fuzz/run.sh): it hands
//   the command line to libFuzzer's driver, `LLVMFuzzerRunDriver` (LLVM's libFuzzer manual, "Using
//   LLVMFuzzerRunDriver"), with `LLVMFuzzerTestOneInput` (FuzzTarget.swift) as the callback;
// - every other build (`swift build`, the sanitizer builds of scripts/test.sh): it runs each
//   file named on its command line once through the same callback and says how many it ran, so
//   that the ordinary build compiles, links and can run the harness.

#if FORGE_REQUEST_FUZZER
    /// libFuzzer's driver: parses libFuzzer's flags from the command line, then fuzzes or replays
    /// with `callback`; returns the process's exit status.
    @_silgen_name("LLVMFuzzerRunDriver")
    private func runLibFuzzerDriver(
        _ argc: UnsafeMutablePointer<CInt>,
        _ argv: UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
        _ callback: @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
    ) -> CInt
#endif

@main
enum RequestFuzzerEntry {
    static func main() {
        #if FORGE_REQUEST_FUZZER
            var argc = CommandLine.argc
            var argv = CommandLine.unsafeArgv
            // A closure, not `fuzzOneInput` itself: compiled file by file (a debug build), naming
            // the `@_cdecl` function as a C function pointer here would define its C symbol a
            // second time, in this file.
            exit(runLibFuzzerDriver(&argc, &argv, { data, size in fuzzOneInput(data, size) }))
        #else
            let paths = CommandLine.arguments.dropFirst()
            for path in paths {
                guard let input = FileManager.default.contents(atPath: path) else {
                    FileHandle.standardError.write(Data("request-fuzzer: cannot read \(path)\n".utf8))
                    exit(2)
                }
                let bytes = [UInt8](input)
                _ = bytes.withUnsafeBufferPointer { fuzzOneInput($0.baseAddress, $0.count) }
            }
            print("request-fuzzer: ran \(paths.count) input(s) once each (no fuzzing: not built by fuzz/run.sh)")
        #endif
    }
}
