#!/usr/bin/env python3
"""End-to-end: the live page `GET /` in headless Chromium (Debian's chromium + chromium-driver).

  1. Starts the server with a state file, opens http://127.0.0.1:PORT/ and waits for
     #state[data-state=open]; #token shows `none`, #version `0`.
  2. POST /register A: #token shows A within 1 s (#version 1, #changed filled in);
     POST /fail: `none` within 1 s; POST /register B: B within 1 s.
  3. SIGTERM: the page leaves `open`. The server is started again on the SAME port with the same
     state file and --max-subscribers 1, and this test takes the one subscriber slot at once, so
     the page's next EventSource gets a 503 (a non-200 answer, after which EventSource gives up):
     the page must show data-state=closed, and once the slot is free it must reconnect by itself
     and show open with B and version 3 within 10 s; then a POST C shows within 1 s.
  4. Saves a screenshot (printed path: $E2E_ARTIFACTS or e2e/artifacts, browser.png), also on failure.
  5. Content-Security-Policy (issue 14): GET / carries the policy, Referrer-Policy, nosniff and
     no-cache; throughout, the browser's console and the page's `securitypolicyviolation` events
     must report no CSP violation (so policy and page cannot drift apart). At the end an image
     from another origin is added on purpose: the check must see that violation, which proves
     it would see one.

    python3 e2e/browser_test.py --server PATH [--chromedriver /usr/bin/chromedriver]
"""
import argparse
import os
import secrets
import tempfile
import time

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from e2e_support import EventStream, Failure, Server, check, log, main, remember_secret, token_hex, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))


def artifacts_dir():
    path = os.environ.get("E2E_ARTIFACTS") or os.path.join(HERE, "artifacts")
    os.makedirs(path, exist_ok=True)
    return path


def make_driver(chromedriver, chromium, workdir):
    options = webdriver.ChromeOptions()
    if chromium:
        options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1000,700", "--no-first-run", "--no-default-browser-check",
                 "--disable-extensions", "--disable-background-networking",
                 "--user-data-dir=" + os.path.join(workdir, "chromium-profile")):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for CSP reports
    service = Service(executable_path=chromedriver, log_output=os.path.join(workdir, "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    # Before any script of the page runs: collect its CSP violation events (a script injected
    # through DevTools is not subject to the page's policy).
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CSP_LISTENER})
    driver.set_page_load_timeout(15)
    driver.set_script_timeout(10)
    return driver


CSP_LISTENER = """
    window.__cspViolations = [];
    document.addEventListener("securitypolicyviolation", (event) => {
      window.__cspViolations.push(event.effectiveDirective + " blocked " + (event.blockedURI || "inline")
                                  + " (" + event.disposition + ")");
    });
"""


class CSPWatch:
    """Every CSP violation the browser reported: console messages about the Content Security
    Policy, and the page's `securitypolicyviolation` events (kept across reads: the console log
    is emptied by each read)."""

    def __init__(self, driver):
        self.driver = driver
        self.console = []

    def violations(self):
        for entry in self.driver.get_log("browser"):
            message = entry.get("message", "")
            if "Content Security Policy" in message or "Content-Security-Policy" in message:
                self.console.append(message)
        events = self.driver.execute_script("return window.__cspViolations || [];")
        return self.console + ["securitypolicyviolation: " + e for e in events]

    def check_none(self, when):
        found = self.violations()
        check(not found, "CSP violations %s:\n  %s" % (when, "\n  ".join(found)))


class Page:
    def __init__(self, driver):
        self.driver = driver

    SNAPSHOT = """
        const text = (id) => { const e = document.getElementById(id); return e ? e.textContent.trim() : null; };
        const state = document.getElementById("state");
        return {token: text("token"), version: text("version"), changed: text("changed"),
                state: state ? state.getAttribute("data-state") : null, state_text: text("state")};
    """

    def text(self, element_id):
        return self.driver.find_element(By.ID, element_id).text.strip()

    def snapshot(self):
        # One round trip for every field, so polling stays fine-grained.
        return self.driver.execute_script(self.SNAPSHOT)

    def wait(self, predicate, timeout, what):
        last = {}

        def probe():
            last["snapshot"] = self.snapshot()
            return predicate(last["snapshot"])
        try:
            wait_until(probe, timeout, interval=0.02, what=what)
        except Failure as error:
            raise Failure("%s; the page shows %r" % (error, last.get("snapshot")))
        return time.monotonic()


def post_and_see(server, page, action, expected_token, expected_version, limit=1.0):
    """Does `action`, then waits (at most `limit` s after the answer) for the page to show it."""
    status, _, body = action()
    check(status == 200, "POST answered %s: %r" % (status, body))
    answered = time.monotonic()
    seen = page.wait(lambda s: s["token"] == expected_token and s["version"] == str(expected_version),
                     limit, "#token %r, #version %s" % (expected_token, expected_version))
    log("  page shows %s (version %s) %.0f ms after the answer"
        % (expected_token[:16] + "…" if len(expected_token) > 16 else expected_token,
           expected_version, (seen - answered) * 1000))


def read_token_page(binary, driver, workdir):
    """Issue 28: with token files, the live page opened with a read token in its address streams
    (and shows a change a writer makes), while that token cannot write; without a token the page's
    stream is refused. Returns the server (stopped)."""
    write, read = "w-" + secrets.token_hex(20), "r-" + secrets.token_hex(20)
    for value in (write, read):
        remember_secret(value)
    files = {}
    for name, value in (("write-tokens", write), ("read-tokens", read)):
        files[name] = os.path.join(workdir, name)
        with open(files[name], "w") as f:
            f.write(value + "\n")
    server = Server(binary, ["--host", "127.0.0.1", "--port", "0", "--write-token-file", files["write-tokens"],
                             "--read-token-file", files["read-tokens"]], workdir=workdir).start()
    page = Page(driver)
    csp = CSPWatch(driver)
    driver.get("http://127.0.0.1:%d/?access_token=%s" % (server.port, read))
    page.wait(lambda s: s["state"] == "open" and s["token"] == "none" and s["version"] == "0", 10,
              "the page opened with a read token to stream")
    log("page opened with a read token: %r" % page.snapshot())
    device = token_hex(0xB0, 28)
    post_and_see(server, page, lambda: server.request(
        "POST", "/register", body=device.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded", "Authorization": "Bearer " + write}), device, 1)
    status, headers, _ = server.request("POST", "/register", body=token_hex(0xB0, 29).encode(),
                                        headers={"Content-Type": "application/x-www-form-urlencoded",
                                                 "Authorization": "Bearer " + read})
    check(status == 403 and 'error="insufficient_scope"' in headers.get("www-authenticate", ""),
          "the page's read token wrote: %s %r" % (status, headers))
    page.wait(lambda s: s["token"] == device and s["version"] == "1", 2, "the page to keep the token")
    csp.check_none("on the page opened with a read token")
    log("the page's read token is refused on a write (403 insufficient_scope); the page kept the token")
    for path in ("/", "/token/stream"):
        status, _, _ = server.request("GET", path)
        check(status == 401, "GET %s without a token answered %s, not 401" % (path, status))
    check(server.stop() == 0, "server did not exit 0 on SIGTERM")
    return server


def run():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    os.environ.setdefault("SE_OFFLINE", "true")  # never let Selenium Manager go online

    workdir = tempfile.mkdtemp(prefix="e2e-browser-")
    state_file = os.path.join(workdir, "state.json")
    screenshot = os.path.join(artifacts_dir(), "browser.png")
    server = Server(args.server, ["--host", "127.0.0.1", "--port", "0", "--access-log", "off",
                                  "--state-file", state_file], workdir=workdir).start()
    port = server.port
    log("server pid %d on port %d, state file %s" % (server.proc.pid, port, state_file))
    servers = [server]
    driver = None
    holder = None
    try:
        status, headers, body = server.request("GET", "/")
        check(status == 200, "GET / answered %s" % status)
        check(headers.get("content-type", "").startswith("text/html"), "GET / Content-Type %r" % headers.get("content-type"))
        for element in ('id="token"', 'id="version"', 'id="changed"', 'id="state"'):
            check(element.encode() in body, "GET / has no element %s" % element)
        csp = headers.get("content-security-policy", "")
        for directive in ("default-src 'none'", "connect-src 'self'", "frame-ancestors 'none'",
                          "base-uri 'none'", "form-action 'none'", "script-src 'sha256-", "style-src 'sha256-"):
            check(directive in csp, "GET / Content-Security-Policy %r lacks %s" % (csp, directive))
        check("unsafe" not in csp, "GET / Content-Security-Policy allows something unsafe: %r" % csp)
        check(headers.get("referrer-policy") == "no-referrer", "GET / Referrer-Policy %r" % headers.get("referrer-policy"))
        check(headers.get("x-content-type-options") == "nosniff", "GET / X-Content-Type-Options %r"
              % headers.get("x-content-type-options"))
        check(headers.get("cache-control") == "no-cache", "GET / Cache-Control %r" % headers.get("cache-control"))

        started = time.monotonic()
        driver = make_driver(args.chromedriver, args.chromium, workdir)
        log("chromium %s via %s started in %.1f s" % (driver.capabilities.get("browserVersion"),
                                                      args.chromedriver, time.monotonic() - started))
        page = Page(driver)
        csp = CSPWatch(driver)
        driver.get("http://127.0.0.1:%d/" % port)
        page.wait(lambda s: s["state"] == "open" and s["token"] == "none" and s["version"] == "0", 10,
                  "the page to open its stream and show token none, version 0")
        log("page open: %r" % page.snapshot())
        csp.check_none("while the page loaded and opened its stream")

        a, b, c = token_hex(0xB0, 1), token_hex(0xB0, 2), token_hex(0xB0, 3)
        post_and_see(server, page, lambda: server.register(a), a, 1)
        check(page.text("changed") not in ("", "…"), "#changed is not filled in after a change")
        post_and_see(server, page, lambda: server.fail(), "none", 2)
        post_and_see(server, page, lambda: server.register(b), b, 3)

        # Stop: the page notices.
        code = server.stop()
        check(code == 0, "server exited %s on SIGTERM" % code)
        page.wait(lambda s: s["state"] != "open", 5, "the page to leave 'open' after the server stopped")
        log("server stopped; page: %r" % page.snapshot())

        # Restart on the same port, full at once: the page's next EventSource gets a 503.
        restarted = time.monotonic()
        for attempt in range(1, 4):
            server = Server(args.server, ["--host", "127.0.0.1", "--port", str(port), "--access-log", "off",
                                          "--state-file", state_file, "--max-subscribers", "1"],
                            workdir=workdir)
            servers.append(server)
            deadline = time.monotonic() + 10
            while True:  # the port may still be held for a moment; bounded retry
                try:
                    server.start()
                    break
                except Failure:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
                    server = Server(server.binary, server.args, workdir=workdir)
                    servers.append(server)
            holder = EventStream(port)
            if holder.status == 200:
                break
            # The page won the race for the one slot: try again so that it meets a 503.
            log("  attempt %d: the page took the slot first (%s); restarting" % (attempt, holder.status))
            holder.close()
            holder = None
            check(server.stop() == 0, "server did not exit 0 on SIGTERM")
        check(holder is not None, "could not take the subscriber slot before the page in 3 attempts")
        event = holder.next_token_event()
        check(event == (3, b), "after restart the stream starts with %r, expected (3, B): the state file "
              "did not keep the token" % (event,))
        log("restarted on port %d (pid %d) holding the only subscriber slot" % (port, server.proc.pid))
        page.wait(lambda s: s["state"] == "closed", 15,
                  "the page to show data-state=closed after a 503 on its stream")
        log("page after the 503: %r" % page.snapshot())

        # Free the slot: the page must reconnect by itself.
        holder.close()
        holder = None
        freed = time.monotonic()
        recovered = page.wait(lambda s: s["state"] == "open" and s["token"] == b and s["version"] == "3", 10,
                              "the page to reconnect by itself and show B, version 3")
        log("page recovered %.1f s after the slot was freed, %.1f s after the restart: %r"
            % (recovered - freed, recovered - restarted, page.snapshot()))
        post_and_see(server, page, lambda: server.register(c), c, 4)
        csp.check_none("over the whole run (load, updates, 503, reconnect)")
        log("no CSP violation over the whole run")

        driver.save_screenshot(screenshot)
        log("screenshot: %s" % screenshot)

        # The watch must be able to see a violation: an image from elsewhere is one (img-src
        # falls back to default-src 'none').
        driver.execute_script("const i = document.createElement('img'); i.src = 'http://127.0.0.2:9/x.png';"
                              " document.body.appendChild(i);")
        wait_until(lambda: csp.violations(), 5, what="the CSP violation caused on purpose to be reported")
        log("a violation caused on purpose is seen: %s" % csp.violations()[0][:160])
        check(server.stop() == 0, "server did not exit 0 on SIGTERM")
        servers.append(read_token_page(args.server, driver, workdir))
    except BaseException:
        if driver is not None:
            try:
                failed = os.path.join(artifacts_dir(), "browser-failure.png")
                driver.save_screenshot(failed)
                log("screenshot of the failure: %s" % failed)
                log("page at failure: %r" % Page(driver).snapshot())
            except Exception as error:  # the driver may be gone already (urllib3 errors too)
                log("no failure screenshot: %s" % str(error).splitlines()[0][:200])
        for s in servers:
            tail = s.stderr()[-1500:]
            if tail:
                log("server pid %s stderr tail:\n%s" % (s.proc.pid if s.proc else "-", tail))
        raise
    finally:
        if holder is not None:
            holder.close()
        if driver is not None:
            try:
                driver.quit()
            except Exception:
                pass
        for s in servers:
            s.kill()


if __name__ == "__main__":
    main(run)
