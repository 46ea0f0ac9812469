#!/usr/bin/env python3
"""Writes the request fuzzer's seed corpus, fuzz/corpus/ (see fuzz/README.md, "Input format").

Each file is raw HTTP/1.1 request text. A single request carries no Content-Length, so its body
runs to the end of the file and a mutation that lengthens the body is not cut off; pipelined
requests are separated by each body's Content-Length, the last one again running to the end.
Files are written byte for byte (some bodies are binary or not UTF-8). Run it again after
editing; files it does not name are left alone (libFuzzer may have been told to add some).
"""
import os

HEX = "0f3a9c1e5b7d2468ace013579bdf02468ace13579bdf0123456789abcdef0011"  # 32 bytes as 64 digits
SECRET = "s3cr3t-T0ken"  # the bearer token of the harness's "hardened" configuration


def req(lines, body=b"", crlf=True, length=False):
    """One request: the request line and header lines, an empty line, the body."""
    nl = "\r\n" if crlf else "\n"
    lines = list(lines)
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return (nl.join(lines) + nl + nl).encode("utf-8") + body


def pipeline(*requests):
    """Requests one after another: every one but the last gets a Content-Length."""
    out = b""
    for index, (lines, body) in enumerate(requests):
        out += req(lines, body, length=index < len(requests) - 1)
    return out


FILES = {
    # POST /register, each body form of http-api.md
    "register-hex-curl.http": req(["POST /register HTTP/1.1", "Host: 127.0.0.1:8080", "User-Agent: curl/7.88.1", "Accept: */*",
                                   "Content-Type: application/x-www-form-urlencoded"], HEX.encode()),
    "register-hex-uppercase-whitespace.http": req(["POST /register HTTP/1.1", "Host: localhost", "Content-Type: text/plain; charset=utf-8"],
                                                  b"  \t" + HEX.upper().encode() + b"\r\n\n", crlf=False),
    "register-form-field.http": req(["POST /register HTTP/1.1", "Host: localhost", "Content-Type: application/x-www-form-urlencoded"],
                                    b"app=demo&deviceToken=" + HEX[:32].encode() + b"&x=%20+1"),
    "register-form-percent.http": req(["POST /register HTTP/1.1", "Content-Type: application/x-www-form-urlencoded"],
                                      b"device%54oken=%41b%63D%30%31+&deviceToken=zz"),
    "register-json.http": req(["POST /register?source=app HTTP/1.1", "Host: localhost", "Content-Type: Application/JSON ; charset=UTF-8"],
                              b'{"deviceToken":"' + HEX.encode() + b'","extra":[1,2,{"a":null}]}'),
    "register-json-bad.http": req(["POST /register HTTP/1.1", "Content-Type: application/json"],
                                  b'{"deviceToken": 12, "deviceToken": "\\u0041b"}'),
    "register-octet-stream.http": req(["POST /register HTTP/1.1", "Host: localhost", "Content-Type: application/octet-stream"],
                                      bytes(range(0, 256, 8)) + b"\r\n\x00\xff"),
    "register-multipart.http": req(["POST /register HTTP/1.1", "Content-Type: multipart/form-data; boundary=------------------------d74496d66958873e"],
                                   b"--------------------------d74496d66958873e\r\nContent-Disposition: form-data; name=\"deviceToken\"\r\n\r\n"
                                   + HEX.encode() + b"\r\n--------------------------d74496d66958873e--\r\n"),
    "register-long-hex.http": req(["POST /register HTTP/1.1", "Content-Type: text/plain"], ("ab" * 256).encode()),
    "register-too-long-odd.http": req(["POST /register HTTP/1.1"], ("0" * 513).encode(), crlf=False),
    "register-bad-utf8.http": req(["POST /register HTTP/1.1", "Content-Type: text/plain"], b"deviceToken=\xff\xfe\xc3\x28%zz&\xe2\x82"),
    "register-chunked.http": req(["POST /register HTTP/1.1", "Host: localhost", "Transfer-Encoding: chunked", "Expect: 100-continue"],
                                 b"40\r\n" + HEX.encode() + b"\r\n0\r\n\r\n"),
    "register-content-length-short.http": req(["POST /register HTTP/1.1", "Content-Type: text/plain", "Content-Length: 4"],
                                              HEX.encode()),
    "method-lowercase.http": req(["post /register HTTP/1.1", "Content-Type: text/plain"], HEX.encode()),
    # POST /fail
    "fail-json.http": req(["POST /fail HTTP/1.1", "Content-Type: application/json"],
                          b'{"message":"remote notifications are not supported in the simulator","domain":"NSCocoaErrorDomain","code":3010,"userInfo":{}}'),
    "fail-json-bad-code.http": req(["POST /fail HTTP/1.1", "Content-Type: application/json; charset=utf-8"], b'{"message":"x","code":"3010"}'),
    "fail-text.http": req(["POST /fail HTTP/1.1", "Content-Type: text/plain; charset=utf-8"],
                          "no v\u00e1lid entitlement \u2603 \"quoted\" \\ \t".encode("utf-8")),
    "fail-empty.http": req(["POST /fail HTTP/1.1", "Host: localhost", "Content-Length: 0"]),
    "fail-bad-utf8.http": req(["POST /fail HTTP/1.1"], b"\xc0\xaf\xed\xa0\x80 message"),
    # Reads
    "token-get-query.http": req(["GET /token?x=1&y=%zz HTTP/1.1", "Host: localhost", "Accept: application/json"]),
    "token-head.http": req(["HEAD /token HTTP/1.1", "Host: localhost"], crlf=False),
    "stream-get-last-event-id.http": req(["GET /token/stream HTTP/1.1", "Host: localhost", "Accept: text/event-stream",
                                          "Cache-Control: no-cache", "Last-Event-ID: 42"]),
    "stream-get-bad-last-event-id.http": req(["GET /token/stream?retry=1 HTTP/1.1", "Last-Event-ID: \u00e9\u0000-1"]),
    "stream-head.http": req(["HEAD /token/stream HTTP/1.1", "Host: localhost"]),
    "healthz.http": req(["GET /healthz HTTP/1.1", "Host: localhost"]),
    "livez.http": req(["GET /livez HTTP/1.1", "Host: localhost"]),
    "readyz.http": req(["HEAD /readyz HTTP/1.1", "Host: localhost"]),
    "metrics.http": req(["GET /metrics HTTP/1.1", "Host: localhost"]),
    "page.http": req(["GET / HTTP/1.1", "Host: localhost", "Accept: text/html"]),
    # Routing
    "not-found.http": req(["GET /tokens/../token%2F?x HTTP/1.1", "Host: localhost"]),
    "method-not-allowed.http": req(["DELETE /token HTTP/1.1", "Host: localhost"]),
    "options-plain.http": req(["OPTIONS /register HTTP/1.1", "Host: localhost"]),
    "options-preflight.http": req(["OPTIONS /register HTTP/1.1", "Host: localhost", "Origin: https://app.example.com",
                                   "Access-Control-Request-Method: POST", "Access-Control-Request-Headers: authorization, content-type"]),
    "options-preflight-denied.http": req(["OPTIONS /token/stream HTTP/1.1", "Origin: https://evil.example:8443",
                                          "Access-Control-Request-Method: GET"]),
    # Bearer token and CORS (the "hardened" configuration)
    "auth-register-cors.http": req(["POST /register HTTP/1.1", "Host: localhost", "Origin: HTTPS://APP.EXAMPLE.COM",
                                    f"Authorization: Bearer {SECRET}", "Content-Type: application/json"],
                                   b'{"deviceToken":"' + HEX.encode() + b'"}'),
    "auth-wrong-token.http": req(["POST /fail HTTP/1.1", f"Authorization: bearer   {SECRET[:-1]}N"], b"bad token"),
    "auth-query-stream.http": req([f"GET /token/stream?access_token={SECRET.replace('-', '%2D')}&x=1 HTTP/1.1", "Host: localhost",
                                   "Origin: http://[::1]:8080"]),
    "auth-query-metrics.http": req([f"GET /metrics?access_token={SECRET} HTTP/1.1", "Origin: null"]),
    "origin-policy.http": req(["GET /token HTTP/1.1", "Origin: https://[fe80::1]:65535", "Authorization: Bearer abc+/def=="]),
    # Pipelined sequences: state carried from one request to the next
    "pipeline-register-fail-read.http": pipeline(
        (["POST /register HTTP/1.1", "Content-Type: text/plain"], HEX.encode()),
        (["POST /register HTTP/1.1", "Content-Type: text/plain"], HEX.encode()),
        (["GET /token/stream HTTP/1.1"], b""),
        (["POST /fail HTTP/1.1", "Content-Type: application/json"], b'{"message":"gone"}'),
        (["GET /token HTTP/1.1"], b""),
        (["GET /metrics HTTP/1.1"], b"")),
    "pipeline-hardened.http": pipeline(
        (["POST /register HTTP/1.1", f"Authorization: Bearer {SECRET}", "Content-Type: application/octet-stream"], bytes([1, 2, 3, 4])),
        (["GET /healthz HTTP/1.1"], b""),
        ([f"GET /token?access_token={SECRET} HTTP/1.1", "Origin: https://app.example.com"], b""),
        (["POST /fail HTTP/1.1", f"Authorization: Bearer {SECRET}"], b""),
        ([f"GET /token/stream?access_token={SECRET} HTTP/1.1"], b""),
        (["GET /metrics HTTP/1.1", f"Authorization: Bearer {SECRET}"], b"")),
}

if __name__ == "__main__":
    corpus = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(corpus, exist_ok=True)
    for name, data in FILES.items():
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(FILES)} files to {corpus}")
