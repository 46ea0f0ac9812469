#!/usr/bin/env python3
"""One Markdown table of medians for a results folder written by bench/run.sh.

usage: python3 bench/summarize.py bench/results/<stamp>

Rows are the issue's targets: each figure is the median over the repeats of a run; ratios are
ours / peer from the same run. A figure marked * comes from a run that cpuguard.py still saw
disturbed by other processes after every retry.
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


def main(folder):
    meta_path = os.path.join(folder, "meta.json")
    threads = json.load(open(meta_path)).get("threads", 1) if os.path.exists(meta_path) else 1
    c_name = "C libmicrohttpd, 1 thread" if threads == 1 else f"C libmicrohttpd, pool of {threads}"
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
    # 2. POST /register
    ours_post, d1, _ = rps("ours", "post")
    nchan_post, d2, _ = rps("nchan", "post")
    ratio = ours_post / nchan_post if ours_post and nchan_post else None
    row("POST /register, req/s (access log off)", fmt(ours_post) + star(d1), "–",
        fmt(nchan_post) + star(d2) + (" (publish)" if nchan_post else ""),
        fmt(ratio, 2, " × nchan") if ratio else "–", "≥ 0.8 × nchan", verdict(ratio >= 0.8 if ratio else None))
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
    # 3. fan-out
    ns = sorted({r["_n"] for r in sse}, reverse=True)
    for n in ns:
        ours_runs, nchan_runs = sse_runs("ours", n), sse_runs("nchan", n)
        o99 = med([r["all"]["read_p99_ms"] for r in ours_runs])
        n99 = med([r["all"]["read_p99_ms"] for r in nchan_runs])
        o50 = med([r["all"]["read_p50_ms"] for r in ours_runs])
        n50 = med([r["all"]["read_p50_ms"] for r in nchan_runs])
        omiss = sum(r["missed"] for r in ours_runs) if ours_runs else None
        nmiss = sum(r["missed"] for r in nchan_runs) if nchan_runs else None
        oready = min((r["ready"] for r in ours_runs), default=None)
        interval = (ours_runs or nchan_runs)[0]["interval_ms"]
        m = (ours_runs or nchan_runs)[0]["m"]
        ratio = o99 / n99 if o99 and n99 else None
        ok = None
        if ratio is not None:
            ok = ratio <= 0.5 and omiss == 0 and oready == n
        od = any(r.get("disturbed") for r in ours_runs)
        nd = any(r.get("disturbed") for r in nchan_runs)
        row(f"fan-out {n:,} subscribers, {m} publishes {interval} ms apart: delivery p99 (p50) ms, missed",
            f"{fmt(o99, 1)} ({fmt(o50, 1)}), {fmt(omiss)} missed{star(od)}", "–",
            f"{fmt(n99, 1)} ({fmt(n50, 1)}), {fmt(nmiss)} missed{star(nd)}" if nchan_runs else "–",
            fmt(ratio, 2, " × nchan") if ratio else "–", "p99 ≤ 0.5 × nchan, 0 missed", verdict(ok))
        oc = med([r["connect_s"] for r in ours_runs])
        nc = med([r["connect_s"] for r in nchan_runs])
        row(f"connect {n:,} subscribers (each to its first event), s", fmt(oc, 2), "–", fmt(nc, 2),
            fmt(oc / nc, 2, " × nchan") if oc and nc else "–", "(reported)", "–")
    # 4. memory
    if ns:
        n = ns[0]
        orss = med([r["rss_per_sub_kb"] for r in sse_runs("ours", n)])
        nrss = med([r["rss_per_sub_kb"] for r in sse_runs("nchan", n)])
        row(f"RSS per idle subscriber, kB (at {n:,})", fmt(orss, 2), "–", fmt(nrss, 2),
            fmt(orss / nrss, 2, " × nchan") if orss and nrss else "–", "≤ 4 kB (0.3 × nchan)",
            verdict(orss <= 4.0 if orss else None))
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
        clean = [g for g in guard if g["clean"]]
        dirty = [g for g in guard if not g["clean"]]
        out.append("")
        out.append(f"cpuguard: {len(guard)} tries, {len(dirty)} disturbed by other processes and redone; "
                   f"kept runs saw at most {max((g['foreign_cpu'] for g in clean), default=0):.2f} foreign CPUs.")
    print("\n".join(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
