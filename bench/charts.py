#!/usr/bin/env python3
"""Charts of a results folder written by bench/run.sh: PNG and SVG.

usage: python3 bench/charts.py RESULTS_DIR [--out DIR]
       python3 bench/charts.py --scale SCALE_RESULTS_DIR [--out DIR]

  fanout.png / fanout.svg   event fan-out delay against the number of subscribers: p50 and p99
                            (medians over the repeats), ours beside nginx + nchan and the C fan-out
                            floor (../shared/bench/peers/fanout-c) when the folder has them;
  http.png / http.svg       HTTP request rates (median req/s over the repeats), one bar per server
                            and route, with the access-log and state-file variants of ours;
  scale.png / scale.svg     (--scale, a folder of bench/scale.sh) p99 delay against the number of
                            subscribers over three servers: ours (3 replicas, one Redis) beside
                            the floor (3 fanout-c processes), medians over the repeats.

Written to --out (default: RESULTS_DIR). The SVG files are reproducible: the same results give the
same bytes (a fixed svg.hashsalt, no date in the metadata, text kept as text). matplotlib comes
from Debian's python3-matplotlib (or any venv with matplotlib); the Agg backend needs no display.
Exits 1 when the folder holds no fan-out or no HTTP result.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: E402

# Reproducible output: element ids from a fixed salt, text as <text> (no glyph paths that
# depend on the installed font's version), no creation date.
matplotlib.rcParams.update({
    "svg.hashsalt": "forge-push-token",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 10,
})
SVG_METADATA = {"Date": None, "Creator": "bench/charts.py"}
PNG_METADATA = {"Software": "bench/charts.py"}

# label in the results -> (legend, color, marker)
SERVERS = {
    "ours": ("forge-push-token-server", "#1f77b4", "o"),
    "nchan": ("nginx + nchan, 1 worker", "#d62728", "s"),
    "fanout-c": ("C fan-out floor (epoll, no HTTP parsing)", "#7f7f7f", "^"),
    "floor": ("floor: 3 C fan-out processes (epoll, no HTTP parsing)", "#7f7f7f", "^"),
}
# (label, mode) of http.jsonl -> bar name, in the order drawn
HTTP_BARS = [
    (("ours", "get"), "ours: GET /token"),
    (("mhd-c", "get"), "C libmicrohttpd: GET /token"),
    (("nginx", "get"), "nginx: return 200"),
    (("ours-access-log", "get"), "ours: GET /token, access log on"),
    (("ours", "post"), "ours: POST /register"),
    (("mhd-c", "post"), "C libmicrohttpd: POST /register"),
    (("nchan", "post"), "nchan: publish"),
    (("ours-access-log", "post"), "ours: POST /register, access log on"),
    (("ours-state-file", "post"), "ours: POST /register, --state-file (fsync)"),
]


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def load_fanout(folder):
    """{label: {n: (p50 ms, p99 ms)}}: medians over the repeats."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "sse-*.json"))):
        match = re.search(r"sse-(.+)-n(\d+)-r(\d+)\.json$", path)
        if not match:
            continue
        with open(path) as f:
            record = json.load(f)
        delays = record.get("all", {})
        runs.setdefault(match.group(1), {}).setdefault(int(match.group(2)), []).append(
            (delays.get("read_p50_ms"), delays.get("read_p99_ms")))
    return {label: {n: (median([r[0] for r in rs]), median([r[1] for r in rs])) for n, rs in by_n.items()}
            for label, by_n in runs.items()}


def load_http(folder):
    """{(label, mode): median req/s}."""
    path = os.path.join(folder, "http.jsonl")
    if not os.path.exists(path):
        return {}
    rates = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                rates.setdefault((record["label"], record["mode"]), []).append(record["rps"])
    return {key: median(values) for key, values in rates.items()}


def subtitle(folder):
    """The run's date and machine, and how many of its runs cpuguard saw disturbed."""
    path = os.path.join(folder, "versions.txt")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        lines = dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)
    note = "%s, %s" % (lines.get("date", "?")[:10], lines.get("kernel", "").split("  mem:")[0].replace("  ", ", "))
    records = []
    for name in sorted(glob.glob(os.path.join(folder, "sse-*.json"))):
        with open(name) as f:
            records.append(json.load(f))
    http = os.path.join(folder, "http.jsonl")
    if os.path.exists(http):
        with open(http) as f:
            records += [json.loads(line) for line in f if line.strip()]
    disturbed = sum(1 for r in records if r.get("disturbed"))
    if disturbed:
        note += "; %d of %d runs disturbed by other processes" % (disturbed, len(records))
    return note


def save(figure, out, name):
    figure.savefig(os.path.join(out, name + ".svg"), metadata=SVG_METADATA)
    figure.savefig(os.path.join(out, name + ".png"), dpi=120, metadata=PNG_METADATA)
    plt.close(figure)


def fanout_chart(fanout, note, out):
    figure, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharex=True)
    counts = sorted({n for by_n in fanout.values() for n in by_n})
    for index, (axis, title) in enumerate(zip(axes, ("p50", "p99"))):
        for label in sorted(fanout, key=lambda l: list(SERVERS).index(l) if l in SERVERS else 99):
            name, color, marker = SERVERS.get(label, (label, None, "x"))
            points = sorted((n, delays[index]) for n, delays in fanout[label].items() if delays[index] is not None)
            if points:
                axis.plot([p[0] for p in points], [p[1] for p in points], marker=marker, color=color, label=name)
        axis.set_title("delivery delay, %s" % title)
        axis.set_xlabel("subscribers")
        axis.set_ylabel("ms, publish to event received")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xticks(counts)
        axis.set_xticklabels(["{:,}".format(n) for n in counts])
        axis.xaxis.set_minor_formatter(NullFormatter())
        # Plain milliseconds at 1, 2, 5 × 10^k rather than powers of ten alone.
        axis.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: "{:g}".format(value)))
        axis.yaxis.set_minor_formatter(NullFormatter())
        axis.grid(True, which="major", alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8)
    figure.suptitle("Server-Sent Events fan-out: one publish to every subscriber" + ("\n" + note if note else ""),
                    fontsize=10)
    figure.tight_layout()
    save(figure, out, "fanout")


def http_chart(rates, note, out):
    bars = [(name, rates[key]) for key, name in HTTP_BARS if rates.get(key)]
    bars += [("%s: %s" % key, value) for key, value in sorted(rates.items())
             if value and key not in dict(HTTP_BARS)]
    figure, axis = plt.subplots(figsize=(8.5, 0.45 * len(bars) + 1.4))
    names = [b[0] for b in bars][::-1]
    values = [b[1] for b in bars][::-1]
    colors = ["#1f77b4" if name.startswith("ours") else "#bbbbbb" for name in names]
    axis.barh(names, values, color=colors)
    for y, value in enumerate(values):
        axis.text(value, y, " {:,.0f}".format(value), va="center", fontsize=8)
    axis.set_xlabel("requests per second (wrk, keep-alive, median of the repeats)")
    axis.set_xlim(0, max(values) * 1.18)
    figure.suptitle("HTTP request rates" + ("\n" + note if note else ""), fontsize=10)
    axis.grid(True, axis="x", alpha=0.3)
    figure.tight_layout()
    save(figure, out, "http")


def load_scale(folder):
    """{label: {n: p99 ms}} from bench/scale.sh's scale.jsonl: medians over the repeats."""
    path = os.path.join(folder, "scale.jsonl")
    runs = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                if line.strip():
                    record = json.loads(line)
                    runs.setdefault(record["label"], {}).setdefault(record["n"], []).append(record.get("read_p99_ms"))
    return {label: {n: median(values) for n, values in by_n.items()} for label, by_n in runs.items()}


def scale_chart(scale, out):
    figure, axis = plt.subplots(figsize=(7, 4.2))
    counts = sorted({n for by_n in scale.values() for n in by_n})
    for label in ("ours", "floor"):
        name, color, marker = SERVERS[label]
        if label == "ours":
            name = "forge-push-token-server: 3 replicas, one Redis"
        points = sorted((n, p99) for n, p99 in scale.get(label, {}).items() if p99 is not None)
        if points:
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=marker, color=color, label=name)
    axis.set_xscale("log")
    axis.set_xticks(counts)
    axis.set_xticklabels(["{:,}".format(n) for n in counts])
    axis.xaxis.set_minor_formatter(NullFormatter())
    axis.set_xlabel("subscribers, over three servers on one 2-vCPU machine")
    axis.set_ylabel("p99 ms, publish to event read")
    axis.set_ylim(bottom=0)
    axis.grid(True, which="major", alpha=0.3)
    axis.legend(loc="upper left", fontsize=8)
    figure.suptitle("bench/scale.sh: one publish to every subscriber (median p99 of the repeats)", fontsize=10)
    figure.tight_layout()
    save(figure, out, "scale")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--out")
    parser.add_argument("--scale", action="store_true", help="the folder is bench/scale.sh's")
    args = parser.parse_args()
    out = args.out or args.folder
    os.makedirs(out, exist_ok=True)
    if args.scale:
        scale = load_scale(args.folder)
        if not scale:
            print("charts.py: %s has no scale results" % args.folder, file=sys.stderr)
            return 1
        scale_chart(scale, out)
        print("charts: %s/scale.{png,svg} (%d subscriber counts)" % (out, len({n for b in scale.values() for n in b})))
        return 0
    # A run of some of bench/run.sh's PARTS has only some of the charts' results.
    fanout, rates = load_fanout(args.folder), load_http(args.folder)
    if not fanout and not rates:
        print("charts.py: %s has neither fan-out nor HTTP results" % args.folder, file=sys.stderr)
        return 1
    note = subtitle(args.folder)
    made = []
    if fanout:
        fanout_chart(fanout, note, out)
        made.append("fanout (%d servers x %d subscriber counts)"
                    % (len(fanout), len({n for by_n in fanout.values() for n in by_n})))
    if rates:
        http_chart(rates, note, out)
        made.append("http (%d rates)" % len(rates))
    print("charts: %s/ %s, .png and .svg" % (out, ", ".join(made)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
