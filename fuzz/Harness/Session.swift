import Foundation
import ForgePushToken
@testable import TokenService
import ForgePushTokenOwner
import ServerSupport
import HTTPServing

/// One way the service can be set up; every input is run against each of them.
struct Configuration: Sendable {
    let name: String
    /// A token the manager holds before the first request (version 0), or `nil`.
    let initialToken: [UInt8]?
    let authentication: BearerAuthentication?
    let crossOrigin: CrossOriginPolicy
    /// A state file that can be read but not written (`UnwritableStateFile`): every change is
    /// then answered 503 `state_not_saved` and the service turns degraded.
    let stateFile: StateFile?
    let maxSubscribers = 2

    /// The store behind the owner and the state to start from, as the executable makes them
    /// (Sources/forge-push-token-server/main.swift): a state file's store starts from what
    /// `load()` reads (the store decides every write against it: group commit), memory from
    /// `initialToken` at version 0.
    func makeStore() -> (store: any TokenStore, initial: TokenState) {
        guard let stateFile else {
            return (MemoryTokenStore(), TokenState(version: 0, token: initialToken.map(DeviceTokenHex.encode)))
        }
        let store = StateFileStore(file: stateFile, queue: Self.stateFileQueue)
        do {
            let initial = try store.load()
            require(initial.token == initialToken.map(DeviceTokenHex.encode) && initial.version == 0,
                    "the state file holds \(String(reflecting: initial.token)) at version \(initial.version)")
            return (store, initial)
        } catch {
            fatalError("the harness's state file cannot be read: \(error)")
        }
    }

    /// The bearer token of the `hardened` configuration (also in http.dict and the corpus).
    static let secret = "s3cr3t-T0ken"

    /// The header fields of the observer's own `GET /token/stream`: the bearer token when one is set.
    static func observerHeaders(_ configuration: Configuration) -> HTTPHeaders {
        configuration.authentication == nil ? HTTPHeaders() : ["Authorization": "Bearer \(secret)"]
    }

    /// The serial queue every state file's store writes on (StateFileStore's group commit): the
    /// main queue, whose work items run only when the harness turns the main run loop
    /// (`Session.await`, and once at the end of each input), on libFuzzer's own thread. A write
    /// still comes later than its request, as in the server, but no input leaves work running on
    /// another thread. On a queue of its own (a Dispatch worker thread), one input in thirty
    /// ended with more mallocs than frees, and libFuzzer then reran it and scanned the whole heap
    /// for leaks (`__lsan_do_recoverable_leak_check`, 4 to 6 times a second): a third of the CPU
    /// of a run (issue 32 §4).
    static let stateFileQueue = DispatchQueue.main

    static let all: [Configuration] = [
        // The default deployment: open, no CORS, no state file, no token yet.
        Configuration(name: "default", initialToken: nil, authentication: nil, crossOrigin: CrossOriginPolicy(),
                      stateFile: nil),
        // Every option on: bearer token on every route but /healthz, two CORS origins, a state
        // file that fails, and a token registered before the first request.
        Configuration(name: "hardened", initialToken: Array(0..<32),
                      authentication: BearerAuthentication(token: secret, scope: .all),
                      crossOrigin: try! CrossOriginPolicy(origins: ["https://app.example.com", "http://[::1]:8080"]),
                      stateFile: UnwritableStateFile.file(holding: Array(0..<32))),
    ]
}

/// A state file holding a token, in a folder of its own made once per process, that cannot be
/// written: a folder sits at the name of its temporary twin (`<path>.tmp`), so `StateFile.save`
/// fails at its first step (`create`) even for root, while `load()` reads the file. (A file in a
/// folder that does not exist cannot start from a token: the store decides every write against
/// what it loaded.) The folder is removed when the process exits normally.
enum UnwritableStateFile {
    static func file(holding token: [UInt8]) -> StateFile {
        var template = Array("/tmp/forge-push-token-fuzz-XXXXXX".utf8CString)
        guard let folder = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }).map({ String(cString: $0) })
        else { fatalError("mkdtemp failed: errno \(errno)") }
        let file = StateFile(path: folder + "/state.json")
        do {
            try file.save(.init(token: DeviceTokenHex.encode(token), version: 0))
        } catch {
            fatalError("the harness's state file cannot be written: \(error)")
        }
        guard mkdir(folder + "/state.json.tmp", 0o700) == 0 else { fatalError("mkdir failed: errno \(errno)") }
        folders.withLock { $0.append(folder) }
        atexit {
            for folder in UnwritableStateFile.folders.withLock({ $0 }) {
                rmdir(folder + "/state.json.tmp")
                unlink(folder + "/state.json")
                rmdir(folder)
            }
        }
        return file
    }

    /// The folders made, for removal at exit.
    static let folders = Locked<[String]>([])
}

/// One responder over a fresh service, fed the requests of one input in order, with every
/// invariant checked after each request and at the end.
///
/// A long-lived subscriber (the observer) follows the event stream for the whole session: after
/// each request it must hold exactly the event of the change that request made, or nothing.
final class Session {
    let configuration: Configuration
    let owner: TokenOwner<TokenSnapshot>
    let responder: Responder
    let observer: EventSubscriber
    /// The counters the responder's metrics must show.
    var changes: UInt64 = 0
    var registrationsAccepted: UInt64 = 0
    var registrationsRejected: UInt64 = 0
    var failuresReported: UInt64 = 0
    var unauthorized: UInt64 = 0
    /// Whether the service was degraded (its last change unsaved) before the current request.
    var wasDegraded = false
    /// The request being handled, for failure messages.
    var current: HTTPRequest?
    var context: String {
        "[\(configuration.name)] " + (current.map(describe) ?? "the end of the input")
    }

    init(_ configuration: Configuration) {
        self.configuration = configuration
        let (store, initial) = configuration.makeStore()
        // Built as the executable builds it (`Service`), without an engine.
        let service = Service(store: store, initial: initial,
                              settings: Service.Settings(authentication: configuration.authentication,
                                                         crossOrigin: configuration.crossOrigin,
                                                         maxSubscribers: configuration.maxSubscribers))
        owner = service.owner
        responder = service.responder
        guard case .proceed(let stream, _) = responder.admit(HTTPRequest(method: "GET", target: "/token/stream",
                                                                      headers: Configuration.observerHeaders(configuration))) else {
            fatalError("the observer's GET /token/stream was not admitted")
        }
        let (head, subscription) = responder.streams.open(for: stream, wake: {})
        require(head.status == 200 && subscription != nil, "the observer could not subscribe: \(head.status)")
        observer = subscription!.subscriber
        let first = Self.readAll(observer)
        require(first.bytes == owner.current.event && first.end == .suspended,
                "the observer's first event is not the current snapshot's")
    }

    // MARK: - One request

    func handle(_ raw: RawRequest) {
        let request = HTTPRequest(method: raw.method, target: raw.target, headers: raw.headers, body: raw.body)
        current = request
        let route = Route(path: request.path)
        let before = owner.current
        wasDegraded = owner.health != .ok
        let admission = responder.admit(request)
        let head: HTTPResponse?
        let reply: Responder.Reply
        switch admission {
        case .answer(let response, _):
            head = response
            reply = .response(response)
        case .proceed(let admitted, _):
            head = nil
            reply = responder.respond(to: admitted, body: raw.body)
        }
        let status: Int
        switch reply {
        case .response(let response):
            status = response.status
            if let head {
                require(head.status == response.status && head.body == response.body,
                        "headResponse said \(head.status), respond \(response.status)", context: context)
            }
            checkResponse(response, request: request, route: route, before: before, decidedByHead: head != nil)
        case .eventStream:
            require(head == nil, "an event stream after headResponse answered \(head?.status ?? 0)", context: context)
            require(route == .stream && request.method == "GET", "an event stream for another request", context: context)
            status = stream(request)
        case .later(let pending):
            // The state file's group commit answers on its own queue (StateFileStore): wait for
            // the answer, then check it as any other.
            let response = Self.await(pending)
            status = response.status
            require(head == nil, "a later answer after headResponse answered \(head?.status ?? 0)", context: context)
            checkResponse(response, request: request, route: route, before: before, decidedByHead: false)
        }
        responder.metrics.recordRequest(route: route, method: request.method, status: status, seconds: 0.0002)

        let after = owner.current
        if (400..<500).contains(status) {
            require(after == before, "a \(status) changed the state from \(before.version) \(String(reflecting: before.token)) to \(after.version) \(String(reflecting: after.token))",
                    context: context)
        }
        if after.version != before.version {
            require(after.version == before.version + 1 && after.token != before.token,
                    "a change went from version \(before.version) to \(after.version)", context: context)
            require([Route.register, .fail].contains(route) && request.method == "POST" && (status == 200 || status == 503),
                    "state changed on a \(status) answer", context: context)
            changes += 1
        } else {
            require(after.token == before.token, "the token changed without a new version", context: context)
        }
        if route == .register, request.method == "POST", head == nil {
            if status == 400 { registrationsRejected += 1 } else { registrationsAccepted += 1 }
        }
        if route == .fail, request.method == "POST", head == nil, status != 400 { failuresReported += 1 }
        // Each refusal is counted once: `admit` decides it, once per request.
        if status == 401 { unauthorized += 1 }

        // The observer holds the event of this request's change, or nothing.
        let seen = Self.readAll(observer)
        require(seen.end == .suspended, "the observer's stream ended: \(seen.end)", context: context)
        require(seen.bytes == (after.version != before.version ? after.event : []),
                "the observer got \(String(reflecting: String(decoding: seen.bytes, as: UTF8.self))) for versions \(before.version) → \(after.version)",
                context: context)
        // The counters are checked once, at the end of the input (`finish`), and in every
        // /metrics answer: they only go up, so a request counted wrongly still shows there, and
        // rendering /metrics (which reads /proc) after every request cost most of an input's time.
    }

    /// The invariants of every answer, then those of its route.
    func checkResponse(_ response: HTTPResponse, request: HTTPRequest, route: Route?, before: TokenSnapshot,
                       decidedByHead: Bool) {
        let status = response.status
        require((200..<600).contains(status), "status \(status)", context: context)
        if status >= 400 { checkErrorBody(response) }

        // Routing, which the head alone decides.
        guard let route else {
            require(status == 404, "an unknown path answered \(status)", context: context)
            require(errorCode(response) == "not_found", "a 404 with code \(String(reflecting: errorCode(response)))", context: context)
            checkCrossOrigin(response, request: request)
            return
        }
        let allow = route.allowedMethods.joined(separator: ", ")
        if !route.allowedMethods.contains(request.method) {
            require(status == 405 && errorCode(response) == "method_not_allowed" && response.headers["Allow"] == allow,
                    "a method the route does not take answered \(status) Allow \(String(reflecting: response.headers["Allow"]))",
                    context: context)
        } else if request.method == "OPTIONS" {
            if status == 204 {
                require(response.headers["Allow"] == allow && response.body.isEmpty, "OPTIONS 204 without Allow \(allow)", context: context)
            } else {
                require(status == 403 && errorCode(response) == "origin_not_allowed"
                            && request.headers["Origin"] != nil && request.headers["Access-Control-Request-Method"] != nil
                            && responder.access.crossOrigin.allowOriginValue(for: request.headers["Origin"]) == nil,
                        "OPTIONS answered \(status)", context: context)
            }
        } else if status == 401 {
            require(responder.access.current?.protects(route) == true && errorCode(response) == "unauthorized"
                        && response.headers["WWW-Authenticate"]?.hasPrefix("Bearer realm=\"") == true,
                    "a 401 on an unprotected route or without a challenge", context: context)
        } else {
            require(!decidedByHead, "headResponse answered \(status) for an allowed, authorized request", context: context)
            if let authentication = responder.access.current, authentication.protects(route) {
                require(authentication.check(authorization: request.headers["Authorization"], query: request.query,
                                             method: request.method).isAuthorized,
                        "a protected route answered \(status) to a request that is not authorized", context: context)
            }
            checkRoute(route, response, request: request, before: before)
        }
        checkCrossOrigin(response, request: request)
    }

    /// Answers of allowed, authorized requests, route by route.
    func checkRoute(_ route: Route, _ response: HTTPResponse, request: HTTPRequest, before: TokenSnapshot) {
        let status = response.status
        let after = owner.current
        switch route {
        case .register:
            let expected = Result { () throws(ServiceError) in
                try RequestBodies.deviceTokenHex(contentType: request.headers["Content-Type"], body: request.body)
            }
            switch (status, expected) {
            case (200, .success(let hex)):
                checkSaved()
                let body = jsonObject(response.body)
                let token = body?["token"] as? String
                require(token.map(isStoredToken) == true, "a 200 /register token is not lowercase hex: \(String(reflecting: token))", context: context)
                require(token == hex && after.token == token,
                        "a 200 /register answered \(String(reflecting: token)) for \(hex), the service holds \(String(reflecting: after.token))",
                        context: context)
                require(jsonBool(body ?? [:], "changed") == (before.token != token),
                        "changed is \(String(reflecting: body?["changed"])) going from \(String(reflecting: before.token))", context: context)
            case (503, .success(let hex)):
                checkUnsaved(response, changed: before.token != hex)
                // Refused: neither served nor streamed (issue 42, finding 4).
                require(after.token == before.token,
                        "a 503 state_not_saved changed the token to \(String(reflecting: after.token))", context: context)
            case (400, .failure(let error)):
                require(errorCode(response) == "invalid_token" && errorMessage(response) == error.message,
                        "/register 400 does not carry RequestBodies' error", context: context)
            default:
                require(false, "/register answered \(status); RequestBodies gave \(expected)", context: context)
            }
        case .fail:
            let expected = Result { () throws(ServiceError) in
                try RequestBodies.registrationFailure(contentType: request.headers["Content-Type"], body: request.body)
            }
            switch (status, expected) {
            case (200, .success):
                checkSaved()
                let body = jsonObject(response.body) ?? [:]
                require(isNull(body, "token") && after.token == nil, "a 200 /fail left a token", context: context)
                require(jsonBool(body, "changed") == (before.token != nil), "a 200 /fail has changed \(String(reflecting: body["changed"]))", context: context)
            case (503, .success):
                checkUnsaved(response, changed: before.token != nil)
                require(after.token == before.token, "a 503 /fail changed the token", context: context)
            case (400, .failure(let error)):
                require(errorCode(response) == "invalid_request" && errorMessage(response) == error.message,
                        "/fail 400 does not carry RequestBodies' error", context: context)
            default:
                require(false, "/fail answered \(status); RequestBodies gave \(expected)", context: context)
            }
        case .token:
            let body = jsonObject(response.body) ?? [:]
            let matches = after.token.map { body["token"] as? String == $0 } ?? isNull(body, "token")
            let cacheControl = responder.access.current?.protects(.token) == true ? "private, no-cache" : "no-cache"
            // 304 exactly when If-None-Match names the current ETag (conditional GET, issue 13).
            let expected = IfNoneMatch.matches(request.headers["If-None-Match"], current: after.entityTag) ? 304 : 200
            require(status == expected && matches && response.headers["Cache-Control"] == cacheControl
                        && response.headers["ETag"] == after.entityTag.fieldValue
                        && response.headers["Content-Type"] == (status == 304 ? nil : HTTPResponse.jsonContentType),
                    "/token answered \(status) \(String(reflecting: String(decoding: response.body, as: UTF8.self))) holding \(String(reflecting: after.token))",
                    context: context)
        case .stream:
            require(request.method == "HEAD" && status == 200 && response.body.isEmpty
                        && response.headers["Content-Type"] == ServerSentEvents.contentType,
                    "/token/stream answered \(status) as a complete response", context: context)
        case .healthz, .readyz:
            // /readyz answers as /healthz does (../shared/spec/deploy.md, "Probes"); no drain here.
            let expected = (owner.health != .ok) ? "degraded" : "ok"
            require(status == 200 && jsonObject(response.body)?["status"] as? String == expected,
                    "\(request.path) answered \(status) \(String(reflecting: String(decoding: response.body, as: UTF8.self))), expected \(expected)",
                    context: context)
        case .livez:
            // Liveness depends on nothing: 200 ok whatever the state file did.
            require(status == 200 && jsonObject(response.body)?["status"] as? String == "ok",
                    "/livez answered \(status)", context: context)
        case .metrics:
            require(status == 200, "/metrics answered \(status)", context: context)
            checkMetricsText(response.body)
            checkCounters(in: String(decoding: response.body, as: UTF8.self))
        case .page:
            let expected = IfNoneMatch.matches(request.headers["If-None-Match"], current: LivePage.entityTag) ? 304 : 200
            require(status == expected && !response.body.isEmpty
                        && response.headers["Content-Security-Policy"] == LivePage.contentSecurityPolicy
                        && (status == 304 || response.headers["Content-Type"]?.hasPrefix("text/html") == true),
                    "/ answered \(status)", context: context)
        }
    }

    /// A 200 to a write: never while the last change is unsaved, as this harness's state file
    /// (when there is one) can never be written.
    func checkSaved() {
        require(!wasDegraded && !(owner.health != .ok), "a write answered 200 while the state file could not be written",
                context: context)
    }

    /// A 503 `state_not_saved`: only with a state file, and either for a change that could not be
    /// saved or, unchanged, for a write while the last one failed (the file may hold another state
    /// then, so the service writes it again, and must not answer 200 while it cannot).
    func checkUnsaved(_ response: HTTPResponse, changed: Bool) {
        require(configuration.stateFile != nil && errorCode(response) == "state_not_saved" && (owner.health != .ok),
                "a write answered 503 \(String(reflecting: errorCode(response)))", context: context)
        require(changed || wasDegraded, "503 state_not_saved for an unchanged token while the service was not degraded",
                context: context)
    }

    /// `{"error":"<code>","message":"<text>"}`, as JSON, with the JSON content type.
    func checkErrorBody(_ response: HTTPResponse) {
        let body = parsed(response.body)
        let error = body?["error"] as? String, message = body?["message"] as? String
        require(error.map(isErrorCode) == true && message.map { !$0.isEmpty } == true
                    && response.headers["Content-Type"] == HTTPResponse.jsonContentType,
                "a \(response.status) body is not {\"error\",\"message\"}: \(String(reflecting: String(decoding: response.body, as: UTF8.self)))",
                context: context)
    }

    func errorCode(_ response: HTTPResponse) -> String? { parsed(response.body)?["error"] as? String }
    func errorMessage(_ response: HTTPResponse) -> String? { parsed(response.body)?["message"] as? String }

    /// The last body parsed, so that one response is parsed once however many checks read it.
    private var lastParsed: (body: [UInt8], object: [String: Any]?)?

    /// `jsonObject(body)`, remembered for the next call with the same body.
    func parsed(_ body: [UInt8]) -> [String: Any]? {
        if let lastParsed, lastParsed.body == body { return lastParsed.object }
        let object = jsonObject(body)
        lastParsed = (body, object)
        return object
    }

    /// A response to an allowed origin carries `Access-Control-Allow-Origin`; to any other, none;
    /// with CORS on, every one carries `Vary`. As the engine sends it: its header completed in the
    /// engine's one place (`ResponseHeaders.completing`).
    func checkCrossOrigin(_ response: HTTPResponse, request: HTTPRequest) {
        let origin = request.headers["Origin"]
        let allowed = responder.access.crossOrigin.allowOriginValue(for: origin)
        let headers = ResponseHeaders.completing(response.headers, crossOrigin: responder.access.crossOrigin, origin: origin)
        let sent = headers["Access-Control-Allow-Origin"]
        require(sent == allowed, "Access-Control-Allow-Origin \(String(reflecting: sent)), expected \(String(reflecting: allowed))",
                context: context)
        require(!responder.access.crossOrigin.isEnabled || headers["Vary"] != nil, "an answer without Vary while CORS is on",
                context: context)
    }

    // MARK: - The event stream

    /// A `GET /token/stream` of the harness's own (with the bearer token where one is needed).
    func openStream() -> (HTTPResponse, EventSubscriber?) {
        let request = HTTPRequest(method: "GET", target: "/token/stream", headers: Configuration.observerHeaders(configuration))
        let (head, subscription) = responder.streams.open(for: AdmittedRequest(route: .stream, request: request),
                                                             wake: {})
        return (head, subscription?.subscriber)
    }

    /// `GET /token/stream`: subscribe, read the first event, cancel. Returns the status sent.
    func stream(_ request: HTTPRequest) -> Int {
        let (head, subscription) = responder.streams.open(for: AdmittedRequest(route: .stream, request: request),
                                                             wake: {})
        checkCrossOrigin(head, request: request)
        guard let subscription else {
            require(false, "a stream was refused with \(head.status) while only the observer is subscribed", context: context)
            return head.status
        }
        require(head.status == 200 && head.headers["Content-Type"] == ServerSentEvents.contentType,
                "an event stream's head is \(head.status)", context: context)
        let subscriber = subscription.subscriber
        let first = Self.readAll(subscriber)
        require(first.end == .suspended && first.bytes == owner.current.event,
                "a new subscriber's first event is not the current snapshot's", context: context)
        checkEvent(first.bytes)
        // The client goes away: the engine aborts the stream and removes the subscriber, through
        // the subscription the owner handed out.
        subscription.abort()
        require(Self.readAll(subscriber).end == .abort, "an aborted stream did not abort", context: context)
        subscription.cancel()
        require(owner.subscriberCount == 1, "\(owner.subscriberCount) subscribers after a removal", context: context)
        return head.status
    }

    /// `id: <version>`, `event: token`, `data: {"token":…}`, empty line.
    func checkEvent(_ bytes: [UInt8]) {
        let text = String(decoding: bytes, as: UTF8.self)
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        let snapshot = owner.current
        guard lines.count == 5, lines[0] == "id: \(snapshot.version)", lines[1] == "event: token",
              lines[2].hasPrefix("data: "), lines[3].isEmpty, lines[4].isEmpty,
              let data = jsonObject(Array(lines[2].dropFirst(6).utf8)) else {
            require(false, "a malformed event: \(String(reflecting: text))", context: context)
            return
        }
        let matches = snapshot.token.map { data["token"] as? String == $0 } ?? isNull(data, "token")
        require(matches, "an event's token is not the service's: \(String(reflecting: text))", context: context)
    }

    /// The response of a write in flight, once its store has decided it (as the engine takes it:
    /// parked, resumed once, then taken).
    static func await(_ pending: PendingResponse) -> HTTPResponse {
        for _ in 0..<1_000 {
            if let response = pending.takeIfReady() { return response }
            // One turn of the main run loop runs the main queue's work items (the store's write).
            _ = RunLoop.main.run(mode: .default, before: .distantPast)
        }
        fatalError("a write was not answered after 1,000 turns of the main queue")
    }

    enum End: Equatable { case suspended, endOfStream, abort }

    /// Every byte the subscriber has to give now, in small reads, and how the reading stopped.
    static func readAll(_ subscriber: EventSubscriber) -> (bytes: [UInt8], end: End) {
        var bytes: [UInt8] = []
        let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 13, alignment: 1)
        defer { buffer.deallocate() }
        for _ in 0..<10_000 {
            switch subscriber.read(into: buffer, suspend: {}) {
            case .bytes(let count):
                require(count > 0 && count <= buffer.count, "read gave \(count) bytes")
                bytes += buffer[0..<count]
            case .suspended: return (bytes, .suspended)
            case .endOfStream: return (bytes, .endOfStream)
            case .abort: return (bytes, .abort)
            }
        }
        require(false, "a subscriber kept giving bytes: \(bytes.count)")
        return (bytes, .abort)
    }

    // MARK: - Metrics

    /// The counters as `/metrics` shows them match what the harness counted.
    ///
    /// In a `/metrics` answer (`rendered`), read from its text, which must also show every counter
    /// at the value `ServiceMetrics.counterValues()` gives. At the end of an input, read through
    /// `counterValues()`, whose values `/metrics` writes with `ServiceMetrics.renderCounters`,
    /// a function of the values alone: their lines are rendered and read back once per process
    /// for each set of values (`RenderedCounterValues`). Rendering the whole text and reading it
    /// back after every input was most of an input's time (it reads `/proc` and writes a hundred
    /// lines under AddressSanitizer; issue 32 §4).
    func checkCounters(in rendered: String? = nil) {
        let values = responder.metrics.counterValues()
        let shown: [UInt64]
        if let rendered {
            let metrics = RenderedCounters(text: rendered)
            shown = ServiceMetrics.Counter.allCases.map(metrics.value)
            require(shown == values, "/metrics shows the counters \(shown), counterValues() gives \(values)", context: context)
        } else {
            RenderedCounterValues.check(values, context: context)
            shown = values
        }
        func value(_ counter: ServiceMetrics.Counter) -> UInt64 { shown[counter.rawValue] }
        require(value(.tokenChanges) == changes && value(.registrationsAccepted) == registrationsAccepted
                    && value(.registrationsRejected) == registrationsRejected
                    && value(.failuresReported) == failuresReported
                    && value(.unauthorizedRequests) == unauthorized,
                "metrics counters [changes, accepted, rejected, failures, unauthorized] are [\(value(.tokenChanges)), \(value(.registrationsAccepted)), \(value(.registrationsRejected)), \(value(.failuresReported)), \(value(.unauthorizedRequests))], expected [\(changes), \(registrationsAccepted), \(registrationsRejected), \(failuresReported), \(unauthorized)]",
                context: context)
    }

    /// ASCII lines; request labels from the fixed sets only, whatever paths and methods were sent.
    func checkMetricsText(_ body: [UInt8]) {
        require(body.allSatisfy { $0 < 0x80 }, "the metrics text is not ASCII", context: context)
        let routes = Set(Route.allCases.map(\.rawValue) + ["other"])
        let methods: Set<String> = ["GET", "HEAD", "POST", "OPTIONS", "other"]
        let text = String(decoding: body, as: UTF8.self)
        require(text.contains("\nforge_push_token_token_changes_total \(changes)\n"),
                "the metrics text does not show \(changes) token changes", context: context)
        for line in text.split(separator: "\n") where line.hasPrefix("forge_push_token_http_requests_total{") {
            let labels = line.drop { $0 != "{" }.dropFirst().prefix { $0 != "}" }
            var values: [String: String] = [:]
            for pair in labels.split(separator: ",") {
                let parts = pair.split(separator: "=", maxSplits: 1)
                guard parts.count == 2 else { continue }
                values[String(parts[0])] = String(parts[1].dropFirst().dropLast())
            }
            require(values["route"].map(routes.contains) == true && values["method"].map(methods.contains) == true,
                    "a metrics series with labels outside the fixed sets: \(line)", context: context)
        }
    }

    // MARK: - The end of the input

    /// Whether the engine's own answers are still to be checked (until the first input's end).
    static let engineAnswersToCheck = Locked(true)

    /// A subscriber beyond the limit is refused; shutdown ends the observer's stream cleanly,
    /// refuses new ones and turns /healthz to 503.
    func finish() {
        current = nil
        checkCounters()
        // The answers the engine builds itself, before the responder sees a request. They depend
        // on no input and no service (`EngineAnswers` builds them from the limit alone), so they
        // are checked on the process's first input only: building and parsing their JSON after
        // every input was a tenth of an input's time (issue 32 §4).
        if Self.engineAnswersToCheck.withLock({ first in defer { first = false }; return first }) {
            for response in [EngineAnswers.payloadTooLarge(limit: 4096), EngineAnswers.uriTooLong(limit: 2048)] {
                require([413, 414].contains(response.status), "an engine refusal has status \(response.status)", context: context)
                checkErrorBody(response)
            }
        }
        require(responder.answersCachedReadsBlindly
                    == ((configuration.authentication.map { $0.scope == .writes } ?? true) && !configuration.crossOrigin.isEnabled),
                "answersCachedReadsBlindly is \(responder.answersCachedReadsBlindly)", context: context)
        let extra = openStream()
        require(extra.0.status == 200 && extra.1 != nil, "the second subscriber was refused: \(extra.0.status)", context: context)
        let refused = openStream()
        require(refused.0.status == 503 && refused.1 == nil && refused.0.headers["Retry-After"] != nil,
                "a subscriber over the limit answered \(refused.0.status)", context: context)
        checkErrorBody(refused.0)
        require(errorCode(refused.0) == "too_many_subscribers", "a full service answered \(String(reflecting: errorCode(refused.0)))", context: context)
        if let subscriber = extra.1 { owner.unsubscribe(subscriber.id) }

        owner.stop()
        let closed = openStream()
        require(closed.0.status == 503 && closed.1 == nil && errorCode(closed.0) == "shutting_down",
                "a subscriber after shutdown answered \(closed.0.status)", context: context)
        checkErrorBody(closed.0)
        let end = Self.readAll(observer)
        require(end.end == .endOfStream && end.bytes.isEmpty, "the observer's stream did not end cleanly: \(end.end)", context: context)
        owner.unsubscribe(observer.id)
        let healthz = HTTPRequest(method: "GET", target: "/healthz")
        let reply: Responder.Reply
        switch responder.admit(healthz) {
        case .answer(let response, _): reply = .response(response)
        case .proceed(let admitted, _): reply = responder.respond(to: admitted, body: [])
        }
        if case .response(let health) = reply {
            require(health.status == 503 && jsonObject(health.body)?["status"] as? String == "shutting_down",
                    "/healthz while stopping answered \(health.status)", context: context)
        } else {
            require(false, "/healthz answered an event stream", context: context)
        }
    }
}

/// The counters' lines of `/metrics` for a set of counter values (`ServiceMetrics.renderCounters`),
/// rendered and read back: each counter's line shows its value. Rendering is a function of the
/// values alone, so each set of values is checked once per process (an input makes at most 8
/// requests, so few sets occur) and remembered.
enum RenderedCounterValues {
    static func check(_ values: [UInt64], context: @autoclosure () -> String) {
        if checked.withLock({ $0.contains(values) }) { return }
        var text = PrometheusText()
        ServiceMetrics.renderCounters(values, to: &text)
        let metrics = RenderedCounters(text: text.text)
        let shown = ServiceMetrics.Counter.allCases.map(metrics.value)
        require(shown == values, "the counters' lines show \(shown) for the values \(values)", context: context())
        checked.withLock { _ = $0.insert(values) }
    }

    /// The sets of values checked so far.
    private static let checked = Locked<Set<[UInt64]>>([])
}

/// The counters of a rendered `/metrics` text, by `ServiceMetrics.Counter`.
struct RenderedCounters {
    /// The value of each counter's sample line (`name value`, or `name{labels} value` for a
    /// counter whose name holds its labels), by the counter's raw value; `UInt64.max` when its
    /// line is missing or not a number. Read in one pass over the
    /// UTF-8 bytes, each line compared with the counters' names as bytes: splitting the text into
    /// `Character`s once per counter (issue 19 §4), then into an array of lines and a dictionary,
    /// was a quarter of an input's time (issue 32 §4); the text holds some hundred lines, mostly
    /// histogram buckets.
    private var values = [UInt64](repeating: .max, count: ServiceMetrics.Counter.allCases.count)

    /// Every counter's name as UTF-8 bytes, by raw value.
    private static let names: [[UInt8]] = ServiceMetrics.Counter.allCases.map { Array($0.name.utf8) }

    init(text: String) {
        var text = text
        values = text.withUTF8 { bytes in
            var values = [UInt64](repeating: .max, count: Self.names.count)
            var start = 0
            while start < bytes.count {
                var end = start, space = -1
                while end < bytes.count, bytes[end] != UInt8(ascii: "\n") {
                    if bytes[end] == UInt8(ascii: " ") { space = end }
                    end += 1
                }
                if bytes[start] == UInt8(ascii: "f"), space > start {
                    let name = bytes[start..<space]
                    if let index = Self.names.firstIndex(where: { $0.elementsEqual(name) }) {
                        values[index] = Self.number(bytes[(space + 1)..<end])
                    }
                }
                start = end + 1
            }
            return values
        }
    }

    /// Decimal digits as a `UInt64`; `UInt64.max` when empty, not all digits, or too large.
    private static func number(_ digits: Slice<UnsafeBufferPointer<UInt8>>) -> UInt64 {
        guard !digits.isEmpty else { return .max }
        var value: UInt64 = 0
        for byte in digits {
            guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return .max }
            let (times10, overflow1) = value.multipliedReportingOverflow(by: 10)
            let (sum, overflow2) = times10.addingReportingOverflow(UInt64(byte - UInt8(ascii: "0")))
            if overflow1 || overflow2 { return .max }
            value = sum
        }
        return value
    }

    /// The counter's value, or `UInt64.max` when its line is missing or not a number.
    func value(_ counter: ServiceMetrics.Counter) -> UInt64 {
        values[counter.rawValue]
    }
}
