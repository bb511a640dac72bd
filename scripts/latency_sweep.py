"""Commit-to-sink latency per sink against the offered rate: a table and a chart.

    .venv/bin/python scripts/latency_sweep.py [--rates 50,500,1000,2000] [--duration 60]
        [--dir .txjoin] [--out docs/latency.json] [--chart docs/latency.png]

For each rate it runs ``txjoin demo --orders-only --rate R --duration D --json`` on the
local stack (started if needed, kept running) and keeps the demo's figures: offered and
achieved transactions/s, each sink's commit-to-sink p50/p99/max, Delta's lag behind
PostgreSQL and the verify result. The runs share the stack and resume one checkpoint;
each demo drains to idle before it returns, so a rate starts with no backlog from the
previous one (its tables only hold more rows).
Writes the results as JSON and, with matplotlib, the chart (p50 and p99 per sink, both
axes logarithmic). A rate whose demo fails is recorded with its exit code and stderr's
last line and the sweep goes on; the script exits 1 if any did.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

SINKS = ("postgres", "delta")
COLORS = {"postgres": "#2b7bba", "delta": "#e6550d"}


def run_rate(txjoin: str, directory: str, rate: float, duration: float) -> dict[str, Any]:
    cmd = [txjoin, "demo", "--dir", directory, "--orders-only", "--rate", str(rate),
           "--duration", str(duration), "--json"]
    print(f"# {' '.join(cmd)}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"rate_tx_per_s": rate, "failed": proc.returncode, "error": tail}
    summary: dict[str, Any] = json.loads(lines[-1])
    summary["exit_code"] = proc.returncode
    return summary


def row(summary: dict[str, Any]) -> str:
    if "failed" in summary:
        return f"{summary['rate_tx_per_s']:>7.0f}  failed ({summary['error']})"
    cells = [f"{summary['rate_tx_per_s']:>7.0f}",
             f"{summary.get('achieved_tx_per_s') or 0:>8.0f}"]
    for sink in SINKS:
        one = summary["commit_to_sink_ms_by_sink"].get(sink)
        cells.append("-" if one is None else
                     f"{one['p50'] / 1000:.1f} / {one['p99'] / 1000:.1f} / "
                     f"{one['max'] / 1000:.1f} s")
    mismatches = sum(s["mismatches"] for r in summary["verify"].values()
                     for s in r["sinks"].values())
    cells.append(str(mismatches))
    return "  ".join(cells)


def draw(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if "failed" not in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    for sink in SINKS:
        points = [(r["rate_tx_per_s"], r["commit_to_sink_ms_by_sink"][sink])
                  for r in ok if sink in r["commit_to_sink_ms_by_sink"]]
        if not points:
            continue
        rates = [p[0] for p in points]
        ax.plot(rates, [p[1]["p50"] / 1000 for p in points], "o--", color=COLORS[sink],
                label=f"{sink} p50")
        ax.plot(rates, [p[1]["p99"] / 1000 for p in points], "o-", color=COLORS[sink],
                label=f"{sink} p99")
    ax.set_xscale("log")
    ax.set_yscale("log")
    rates = sorted({r["rate_tx_per_s"] for r in ok})
    ax.set_xticks(rates, [f"{r:g}" for r in rates])
    ax.legend(loc="upper left")
    ax.set_xlabel("offered rate (transactions/s)")
    ax.set_ylabel("commit-to-sink (s)")
    ax.set_title("txjoin demo --orders-only, 2 cores: each sink at its own pace")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="50,500,1000,2000")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--dir", default=".txjoin")
    parser.add_argument("--out", type=Path, default=Path("latency.json"))
    parser.add_argument("--chart", type=Path, default=None)
    parser.add_argument("--txjoin", default=str(Path(sys.executable).parent / "txjoin"))
    args = parser.parse_args()
    results = [run_rate(args.txjoin, args.dir, float(r), args.duration)
               for r in args.rates.split(",")]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"duration_s": args.duration, "runs": results},
                                   indent=1, sort_keys=True) + "\n")
    print("offered  achieved  postgres p50/p99/max  delta p50/p99/max  mismatches")
    for summary in results:
        print(row(summary))
    if args.chart is not None:
        draw(results, args.chart)
    print(f"written to {args.out}" + (f" and {args.chart}" if args.chart else ""))
    return 1 if any("failed" in r or r.get("exit_code") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
