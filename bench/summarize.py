#!/usr/bin/env python3
"""One Markdown table of medians for a results folder written by bench/run.sh.

usage: python3 bench/summarize.py bench/results/<stamp>

Rows are the targets of issue 20: each figure is the median over the repeats of a run; ratios are
ours / peer from the same run. The C peers are the yardsticks, on as many threads as ours: GET /token
and POST /register against the C libmicrohttpd server, the fan-out's p99 against the C fan-out floor;
nginx + nchan is the peer a user would otherwise pick (POST /register at least its rate; its fan-out
ratio is reported). A figure marked * comes from a run that cpuguard.py still saw disturbed by other
processes after every retry; a peer that was not run shows "–".
"""
import glob
import json
import os
import re
import statistics
import sys


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def lines(path):
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def fmt(value, digits=0, suffix=""):
    if value is None:
        return "–"
    return f"{value:,.{digits}f}{suffix}"


def thread_count(n):
    return f"{n} thread" + ("s" if n != 1 else "")


# Fan-out p99 within this many times the C floor's (same threads): 1.15 from 10,000 subscribers up,
# 1.3 below (issue 20).
def fanout_limit(n):
    return 1.15 if n >= 10000 else 1.3


MAX_RSS_PER_SUBSCRIBER_KB = 10.1


def main(folder):
    meta_path = os.path.join(folder, "meta.json")
    meta = json.load(open(meta_path)) if os.path.exists(meta_path) else {}
    threads = meta.get("threads", 1)
    # Folders written before run.sh passed THREADS to the floor ran it on one thread.
    fc_threads = meta.get("fanout_c_threads", 1)
    c_name = ("C libmicrohttpd, 1 thread" if threads == 1 else f"C libmicrohttpd, pool of {threads}") \
        + f"; C fan-out floor, {thread_count(fc_threads)}"
    http = lines(os.path.join(folder, "http.jsonl"))
    idle = lines(os.path.join(folder, "idle.jsonl"))
    startup = lines(os.path.join(folder, "startup.jsonl"))
    sse = []
    for path in sorted(glob.glob(os.path.join(folder, "sse-*.json"))):
        match = re.search(r"sse-(.+)-n(\d+)-r(\d+)\.json$", path)
        record = json.load(open(path))
        record["_label"], record["_n"] = match.group(1), int(match.group(2))
        sse.append(record)

    def http_runs(label, mode):
        return [r for r in http if r["label"] == label and r["mode"] == mode]

    def rps(label, mode):
        runs = http_runs(label, mode)
        return med([r["rps"] for r in runs]), any(r.get("disturbed") for r in runs), runs

    def sse_runs(label, n):
        return [r for r in sse if r["_label"] == label and r["_n"] == n]

    def star(flag):
        return "*" if flag else ""

    rows = []

    def row(measure, ours, c_peer, nginx_peer, ratio, target, holds):
        rows.append(f"| {measure} | {ours} | {c_peer} | {nginx_peer} | {ratio} | {target} | {holds} |")

    def verdict(ok):
        return "–" if ok is None else ("**yes**" if ok else "**no**")

    # 1. GET /token
    ours_get, d1, _ = rps("ours", "get")
    mhd_get, d2, _ = rps("mhd-c", "get")
    nginx_get, d3, _ = rps("nginx", "get")
    ratio = ours_get / mhd_get if ours_get and mhd_get else None
    row("GET /token, req/s (access log off)", fmt(ours_get) + star(d1), fmt(mhd_get) + star(d2),
        fmt(nginx_get) + star(d3) + (" (`return 200`)" if nginx_get else ""),
        fmt(ratio, 2, " × C") if ratio else "–", f"≥ 0.9 × C (same threads: {threads})", verdict(ratio >= 0.9 if ratio else None))
    # 2. POST /register: against the C server's POST (token under a mutex, same threads), and nchan
    ours_post, d1, _ = rps("ours", "post")
    mhd_post, d2, _ = rps("mhd-c", "post")
    nchan_post, d3, _ = rps("nchan", "post")
    ratio = ours_post / mhd_post if ours_post and mhd_post else None
    row("POST /register, req/s (access log off)", fmt(ours_post) + star(d1),
        fmt(mhd_post) + star(d2) + (" (token under a mutex)" if mhd_post else ""),
        fmt(nchan_post) + star(d3) + (" (publish)" if nchan_post else ""),
        fmt(ratio, 2, " × C") if ratio else "–", f"≥ 0.7 × C (same threads: {threads})",
        verdict(ratio >= 0.7 if ratio else None))
    ratio = ours_post / nchan_post if ours_post and nchan_post else None
    row("POST /register, req/s, against nginx + nchan", fmt(ours_post) + star(d1), "–",
        fmt(nchan_post) + star(d3) + (" (publish)" if nchan_post else ""),
        fmt(ratio, 2, " × nchan") if ratio else "–", "≥ 1 × nchan", verdict(ratio >= 1.0 if ratio else None))
    # access log on
    for mode, name in (("get", "GET /token"), ("post", "POST /register")):
        value, disturbed, _ = rps("ours-access-log", mode)
        base = ours_get if mode == "get" else ours_post
        ratio = value / base if value and base else None
        row(f"{name}, req/s, access log **on**", fmt(value) + star(disturbed), "–", "–",
            fmt(ratio, 2, " × log off") if ratio else "–", "(reported)", "–")
    # state file: every change fsync'ed before it is answered
    value, disturbed, _ = rps("ours-state-file", "post")
    ratio = value / ours_post if value and ours_post else None
    row("POST /register, req/s, `--state-file`", fmt(value) + star(disturbed), "–", "–",
        fmt(ratio, 2, " × no file") if ratio else "–", "(reported)", "–")
    # 3. fan-out: p99 against the C fan-out floor on the same threads; nchan's ratio is reported
    def delays(runs):
        """(p99, p50, missed, disturbed) medians and sums over the runs, or Nones."""
        if not runs:
            return None, None, None, False
        return (med([r["all"]["read_p99_ms"] for r in runs]), med([r["all"]["read_p50_ms"] for r in runs]),
                sum(r["missed"] for r in runs), any(r.get("disturbed") for r in runs))

    def delay_cell(runs):
        p99, p50, missed, disturbed = delays(runs)
        return f"{fmt(p99, 1)} ({fmt(p50, 1)}), {fmt(missed)} missed{star(disturbed)}" if runs else "–"

    same_threads = fc_threads == threads
    ns = sorted({r["_n"] for r in sse}, reverse=True)
    for n in ns:
        ours_runs, floor_runs, nchan_runs = sse_runs("ours", n), sse_runs("fanout-c", n), sse_runs("nchan", n)
        o99, _, omiss, _ = delays(ours_runs)
        f99, n99 = delays(floor_runs)[0], delays(nchan_runs)[0]
        oready = min((r["ready"] for r in ours_runs), default=None)
        first = (ours_runs or floor_runs or nchan_runs)[0]
        floor_ratio = o99 / f99 if o99 and f99 else None
        nchan_ratio = o99 / n99 if o99 and n99 else None
        limit = fanout_limit(n)
        ok = None
        # A floor on other threads than ours (an older results folder) is not the target's yardstick.
        if floor_ratio is not None and same_threads:
            ok = floor_ratio <= limit and omiss == 0 and oready == n
        ratios = ([fmt(floor_ratio, 2, " × C floor")] if floor_ratio else []) \
            + ([fmt(nchan_ratio, 2, " × nchan (reported)")] if nchan_ratio else [])
        target = f"p99 ≤ {limit:g} × C floor, 0 missed" + (
            f" (same threads: {threads})" if same_threads
            else f" (the floor ran on {thread_count(fc_threads)}, ours on {threads}: no verdict)")
        row(f"fan-out {n:,} subscribers, {first['m']} publishes {first['interval_ms']} ms apart: "
            "delivery p99 (p50) ms, missed",
            delay_cell(ours_runs), delay_cell(floor_runs) + (" (floor)" if floor_runs else ""),
            delay_cell(nchan_runs), "; ".join(ratios) or "–", target, verdict(ok))
        oc = med([r["connect_s"] for r in ours_runs])
        fcc = med([r["connect_s"] for r in floor_runs])
        nc = med([r["connect_s"] for r in nchan_runs])
        row(f"connect {n:,} subscribers (each to its first event), s", fmt(oc, 2), fmt(fcc, 2), fmt(nc, 2),
            fmt(oc / nc, 2, " × nchan") if oc and nc else "–", "(reported)", "–")
    # 4. memory
    if ns:
        n = ns[0]
        orss = med([r["rss_per_sub_kb"] for r in sse_runs("ours", n)])
        frss = med([r["rss_per_sub_kb"] for r in sse_runs("fanout-c", n)])
        nrss = med([r["rss_per_sub_kb"] for r in sse_runs("nchan", n)])
        row(f"RSS per idle subscriber, kB (at {n:,})", fmt(orss, 2), fmt(frss, 2) + (" (floor)" if frss else ""),
            fmt(nrss, 2), fmt(orss / nrss, 2, " × nchan") if orss and nrss else "–",
            f"≤ {MAX_RSS_PER_SUBSCRIBER_KB:g} kB", verdict(orss <= MAX_RSS_PER_SUBSCRIBER_KB if orss else None))
    # 5. idle CPU
    if idle:
        percent = med([r["percent"] for r in idle])
        row(f"{idle[0]['n']:,} idle subscribers between heartbeats, % of one core "
            f"({idle[0]['window_s']:.0f} s window)", fmt(percent, 3, " %"), "–", "–", "–", "< 1 %",
            verdict(percent < 1.0))
    # 6. start-up
    if startup:
        ms = med([r["median_ms"] for r in startup])
        row("start to `listening`, ms", fmt(ms, 1), "–", "–", "–", "< 50 ms", verdict(ms < 50))

    out = [f"| measure | ours (forge-push-token-server, {threads} thread{'s' if threads > 1 else ''}) | {c_name} | nginx + nchan, 1 worker "
           "| ratio | target | holds |", "|---|---|---|---|---|---|---|"] + rows
    runs = max([len(http_runs("ours", "get")), len(sse_runs("ours", ns[0])) if ns else 0, len(idle)] or [0])
    out.append("")
    out.append(f"Medians of {runs} runs. HTTP: wrk keep-alive; latency and every run below.")
    out.append("")
    out.append("Per run:")
    for label, mode in sorted({(r["label"], r["mode"]) for r in http}):
        runs_ = http_runs(label, mode)
        out.append(f"- {label} {mode}: " + ", ".join(f"{r['rps']:,.0f}" for r in runs_) + " req/s; p50 "
                   + ", ".join(f"{r['lat_p50_us'] / 1000:.2f}" for r in runs_) + " ms; p99 "
                   + ", ".join(f"{r['lat_p99_us'] / 1000:.2f}" for r in runs_) + " ms; errors "
                   + str(sum(r["errors"] for r in runs_)))
    for label, n in sorted({(r["_label"], r["_n"]) for r in sse}):
        runs_ = sse_runs(label, n)
        out.append(f"- {label} fan-out N={n}: p50 / p99 / max ms "
                   + "; ".join(f"{r['all']['read_p50_ms']:.1f} / {r['all']['read_p99_ms']:.1f} / "
                               f"{r['all']['read_max_ms']:.1f}" for r in runs_)
                   + "; missed " + ", ".join(str(r["missed"]) for r in runs_)
                   + "; RSS/sub kB " + ", ".join(f"{r['rss_per_sub_kb']:.2f}" for r in runs_)
                   + "; connect s " + ", ".join(f"{r['connect_s']:.2f}" for r in runs_))
    if idle:
        out.append("- idle CPU %: " + ", ".join(f"{r['percent']:.3f}" for r in idle))
    if startup:
        out.append("- start to listening ms (median of 5 starts each): "
                   + ", ".join(f"{r['median_ms']:.1f}" for r in startup))
    guard = lines(os.path.join(folder, "guard.jsonl"))
    if guard:
        # guard.jsonl holds every try in order, labelled "<run>#<try>": a run starts at its try 1 and
        # was disturbed when none of its tries was clean (it is kept, its figures marked *).
        runs_clean = []
        for g in guard:
            if g["label"].endswith("#1") or not runs_clean:
                runs_clean.append(False)
            runs_clean[-1] = runs_clean[-1] or g["clean"]
        clean = [g for g in guard if g["clean"]]
        out.append("")
        out.append(f"cpuguard: {runs_clean.count(False)} of {len(runs_clean)} runs disturbed ({len(guard)} tries, "
                   f"{disturbance(guard)}); clean tries saw at most "
                   f"{max((g['foreign_cpu'] for g in clean), default=0):.2f} foreign CPUs and "
                   f"{max((g.get('steal_cpu', 0) for g in clean), default=0):.2f} CPUs stolen by the hypervisor; "
                   f"steal over all tries: median {statistics.median([g.get('steal_cpu', 0) for g in guard]):.2f}, "
                   f"at most {max(g.get('steal_cpu', 0) for g in guard):.2f} CPUs.")
    print("\n".join(out))



def disturbance(guard):
    """How many tries were disturbed, and by what. cpuguard.py rejects a try whose steal exceeds
    its --max-steal (0.10 CPUs, which the bench scripts keep) or whose foreign CPU exceeds
    --max-foreign: a rejected try with steal over 0.10 counts as stolen, any other as foreign."""
    bad = [g for g in guard if not g["clean"]]
    steal = sum(1 for g in bad if g.get("steal_cpu", 0) > 0.10)
    return f"{len(bad)} of them disturbed: {len(bad) - steal} by other processes, {steal} by hypervisor steal"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
