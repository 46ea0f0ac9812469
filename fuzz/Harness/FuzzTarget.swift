import Foundation

// The libFuzzer entry point of the request fuzzer (fuzz/README.md).
//
// Each input is read as pipelined HTTP/1.1 request text (`RequestText`), then:
// 1. each request's pieces go through the pure decoders directly (`BodyChecks`);
// 2. for each `Configuration`, a fresh service and `Responder` answer the requests in order
//    (`Session.handle`), with the invariants checked after every request, and the session ends
//    with the subscriber limit and shutdown (`Session.finish`).
// A violated invariant stops the process (`require`), which libFuzzer records as a crash.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    let requests = RequestText.parse(input)
    for request in requests { BodyChecks.run(request) }
    for configuration in Configuration.all {
        let session = Session(configuration)
        for request in requests { session.handle(request) }
        session.finish()
    }
    // Whatever this input left on the main queue (the state file's writes run there: see
    // `Configuration.stateFileQueue`) runs now, inside the input.
    _ = RunLoop.main.run(mode: .default, before: .distantPast)
    return 0
}
