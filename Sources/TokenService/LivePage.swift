import HTTPServing
import ServerSupport

#if canImport(FoundationEssentials)
    import FoundationEssentials
#else
    import Foundation
#endif

/// `GET /`: a small self-contained page that shows the token live.
///
/// No outside assets and no build step: one HTML document with inline CSS and script, served from
/// the binary. The script follows `/token/stream` with `EventSource`
/// (`addEventListener("token", …)`; WHATWG HTML, "Server-sent events") and shows the token, its
/// version (the event id), when the page last saw it change, and the connection state. An
/// `EventSource` reconnects by itself after a network error or a cleanly ended stream, but closes
/// for good after a non-200 answer; the page then opens a new one after a growing delay (1 s
/// doubling up to 30 s), so it recovers from a restart or a full service by itself.
public enum LivePage {
    /// The page's `Content-Type`.
    public static let contentType = "text/html; charset=utf-8"

    /// The page, UTF-8.
    public static let html: [UInt8] = Array(
        #"""
        <!doctype html>
        <html lang="en">
        <head>
        <meta charset="utf-8">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>forge-push-token</title>
        <style>
          body { font: 16px/1.5 system-ui, sans-serif; margin: 2rem auto; max-width: 46rem; padding: 0 1rem; color: #1d1d1f; }
          h1 { font-size: 1.3rem; }
          dl { display: grid; grid-template-columns: max-content 1fr; gap: .4rem 1rem; }
          dt { color: #6e6e73; }
          dd { margin: 0; }
          #token { font-family: ui-monospace, monospace; word-break: break-all; }
          #state[data-state="open"] { color: #1a7f37; }
          #state[data-state="connecting"] { color: #9a6700; }
          #state[data-state="closed"] { color: #cf222e; }
        </style>
        </head>
        <body>
        <h1>APNs device token</h1>
        <dl>
          <dt>Token</dt><dd id="token">…</dd>
          <dt>Version</dt><dd id="version">…</dd>
          <dt>Last change seen</dt><dd id="changed">…</dd>
          <dt>Connection</dt><dd id="state" data-state="connecting">connecting</dd>
        </dl>
        <script>
        "use strict";
        const $ = (id) => document.getElementById(id);
        let source = null, retryDelay = 1000, retryTimer = null, lastToken;
        function setState(state, text) { $("state").dataset.state = state; $("state").textContent = text; }
        function connect() {
          retryTimer = null;
          setState("connecting", "connecting");
          source = new EventSource("token/stream" + location.search);
          source.onopen = () => { retryDelay = 1000; setState("open", "live"); };
          source.addEventListener("token", (event) => {
            const token = JSON.parse(event.data).token;
            $("token").textContent = token === null ? "none" : token;
            $("version").textContent = event.lastEventId;
            if (token !== lastToken) { $("changed").textContent = new Date().toLocaleString(); lastToken = token; }
            setState("open", "live");
          });
          source.onerror = () => {
            if (source.readyState === EventSource.CLOSED) {
              // A non-200 answer (a restart in progress, a full service): EventSource gave up; retry.
              setState("closed", "disconnected, retrying in " + retryDelay / 1000 + " s");
              if (retryTimer === null) { retryTimer = setTimeout(connect, retryDelay); }
              retryDelay = Math.min(retryDelay * 2, 30000);
            } else {
              setState("connecting", "reconnecting");
            }
          };
        }
        connect();
        </script>
        </body>
        </html>

        """#.utf8)
}

extension LivePage {
    /// The page's `Content-Security-Policy` (W3C Content Security Policy Level 3): nothing may load
    /// or run but the page's own inline `<style>` and `<script>` elements, each allowed by the
    /// SHA-256 hash of its text as served (computed from `html` when first used, so that the policy
    /// follows the page), and `EventSource` connections to the page's own origin (`connect-src
    /// 'self'`, for `/token/stream`). No framing (`frame-ancestors 'none'`, against clickjacking), no
    /// `<base>` (`base-uri 'none'`), no form submission (`form-action 'none'`).
    public static let contentSecurityPolicy: String = {
        let scripts = inlineHashSources(element: "script", in: html).joined(separator: " ")
        let styles = inlineHashSources(element: "style", in: html).joined(separator: " ")
        return "default-src 'none'; script-src \(scripts.isEmpty ? "'none'" : scripts); "
            + "style-src \(styles.isEmpty ? "'none'" : styles); connect-src 'self'; "
            + "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    }()

    /// The page's entity tag: the strong validator of `html` (see `EntityTag.strong(digesting:)`).
    public static let entityTag = EntityTag.strong(digesting: html)

    /// The header fields of the page's `200` (and of its `304`, less `Content-Type`):
    /// `Content-Type`, `Cache-Control: no-cache` (a cache may keep the page but must revalidate it
    /// every time; `private, no-cache` when reading it needs the bearer token, so that no shared
    /// cache keeps it), `ETag`, `Content-Security-Policy` and `Referrer-Policy: no-referrer` (the
    /// page's address can hold the bearer token as `access_token`; no request it makes may carry
    /// it to another site).
    public static func headers(isPrivate: Bool) -> HTTPHeaders {
        [
            "Content-Type": contentType,
            "Cache-Control": isPrivate ? "private, no-cache" : "no-cache",
            "ETag": entityTag.fieldValue,
            "Content-Security-Policy": contentSecurityPolicy,
            "Referrer-Policy": "no-referrer",
        ]
    }

    /// The CSP hash sources (`'sha256-<base64>'`) of the text of every `<element>…</element>` in
    /// `page`, in order: the bytes between the start tag (written exactly `<element>`, without
    /// attributes) and the end tag, as the browser hashes them.
    static func inlineHashSources(element: String, in page: [UInt8]) -> [String] {
        let open = Array("<\(element)>".utf8)
        let close = Array("</\(element)>".utf8)
        var sources: [String] = []
        var searchFrom = page.startIndex
        while let start = page[searchFrom...].firstRange(of: open),
            let end = page[start.upperBound...].firstRange(of: close)
        {
            let text = page[start.upperBound..<end.lowerBound]
            sources.append("'sha256-\(Data(SHA256.digest(text)).base64EncodedString())'")
            searchFrom = end.upperBound
        }
        return sources
    }
}
