#!/usr/bin/env python3
"""bench/search_compare/seeds.py OUT [OUT ...] — the comparison repeated with other seeds:
each OUT is a run.sh output folder (same calibration, another SEED). Prints, per limit and
method, each seed's eight-benchmark average, WikiText-2 perplexity and measured latency (or peak
memory, at the memory limit),
their mean and spread (max - min), and AutoCompress minus Minitron++ per seed, so that a
gap can be read against the seeds' noise. Markdown on stdout; nothing is written."""
import json
import math
import os
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def job(out, limit, method):
    """(seed, task average, items, ppl, measured ms, holds) of one job, or None."""
    d = os.path.join(out, f"{limit}-{method}")
    j, r = load(os.path.join(d, "job.json")), load(os.path.join(d, "report.json"))
    if not j or j.get("status") != "succeeded" or not r:
        return None
    res = r.get("result") or {}
    acc = res.get("accuracy") or {}
    items = sum(v.get("n", 0) for v in acc.values() if isinstance(v, dict))
    p = load(os.path.join(d, "ppl.json")) or {}
    return {"seed": (r.get("search") or {}).get("seed"), "avg": res.get("average"), "items": items,
            "ppl": p.get("ppl"), "ms": (res.get("measured") or {}).get("latency_ms"),
            "mib": ((res.get("measured") or {}).get("peak_memory_bytes") or 0) / 2**20 or None,
            "holds": bool(r.get("limits")) and all(x.get("holds") for x in r["limits"])}


def stats(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    m = sum(xs) / len(xs)
    return f"{m:.4f} (spread {max(xs) - min(xs):.4f})" if m < 10 else f"{m:.1f} (spread {max(xs) - min(xs):.1f})"


def main():
    outs = sys.argv[1:]
    if not outs:
        sys.exit("usage: seeds.py OUT [OUT ...]")
    limits = [lim for lim in ("latency", "memory") if any(job(o, lim, "autocompress") for o in outs)]
    print("| limit | method | seeds | task avg per seed | mean (spread) | wiki ppl per seed | mean (spread) "
          "| measured per seed (latency: ms, memory: MiB) | holds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for lim in limits:
        for m in ("autocompress", "minitron"):
            js = [job(o, lim, m) for o in outs]
            js = [j for j in js if j]
            seeds = ", ".join(str(j["seed"]) for j in js)
            avgs = ", ".join(f"{j['avg']:.4f}" for j in js)
            ppls = ", ".join(f"{j['ppl']:.1f}" if j["ppl"] else "—" for j in js)
            key = "ms" if lim == "latency" else "mib"
            ms = ", ".join(f"{j[key]:.1f}" for j in js if j[key])
            holds = ", ".join("yes" if j["holds"] else "no" for j in js)
            print(f"| {lim} | {m} | {seeds} | {avgs} | {stats([j['avg'] for j in js])} | {ppls} | "
                  f"{stats([j['ppl'] for j in js])} | {ms} | {holds} |")
    print()
    for lim in limits:
        diffs, ses = [], []
        for o in outs:
            a, b = job(o, lim, "autocompress"), job(o, lim, "minitron")
            if not (a and b and a["avg"] is not None and b["avg"] is not None):
                continue
            diffs.append((a["seed"], a["avg"] - b["avg"]))
            # the standard error of a difference of two averages over n items each
            n = max(min(a["items"], b["items"]), 1)
            ses.append(math.sqrt(a["avg"] * (1 - a["avg"]) / n + b["avg"] * (1 - b["avg"]) / n))
        if not diffs:
            continue
        mean = sum(d for _, d in diffs) / len(diffs)
        per = ", ".join(f"seed {s}: {100 * d:+.2f}" for s, d in diffs)
        same = all(d > 0 for _, d in diffs) or all(d < 0 for _, d in diffs)
        print(f"- {lim} limit: AutoCompress minus Minitron++ task average, points: {per}; mean "
              f"{100 * mean:+.2f}; one seed's item-sampling standard error of the difference about "
              f"{100 * sum(ses) / len(ses):.2f}; the sign {'holds for every seed' if same else 'changes between seeds'}.")


if __name__ == "__main__":
    main()
