"""Verify chart: throughput per concurrency (baseline vs this run) and acceptance, from report.json.

Controller-only code, run with the playbook's Python; needs matplotlib (the Agg backend, no display). Imported by
plugin_utils/verify_report.py (the action plugin verify_report draws throughput.png through it), and a
command-line program, with the collection importable (roles/verify/tasks/controller_preflight.yml runs --check):
    python -m ansible_collections.blackwell.serving.plugins.plugin_utils.verify_chart --report R --out O [--check]
Exit status 3 when matplotlib is missing, with the package to install named on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def load_pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        print(f"verify chart: matplotlib is not importable by {sys.executable} ({exc}); install it into the "
              "controller's Python environment: `pip install matplotlib` (the project's controller "
              "requirements pin it)", file=sys.stderr)
        raise SystemExit(3) from None
    return plt


def value(row: dict, key: str) -> float | None:
    item = row.get(key)
    return item.get("value") if isinstance(item, dict) else None


def draw(report: dict, out: Path) -> None:
    plt = load_pyplot()
    rows = report["levels"]
    labels = [str(r["concurrency"]) for r in rows]
    positions = list(range(len(rows)))
    current = [value(r, "output_throughput") or 0.0 for r in rows]
    baseline = [value(r, "baseline_output_throughput") for r in rows]
    accept = [(r.get("acceptance") or {}).get("rate") for r in rows]
    show_accept = report["speculative"] and any(a is not None for a in accept)
    fig, axes = plt.subplots(1, 2 if show_accept else 1, figsize=(11 if show_accept else 7, 4.2), squeeze=False)
    ax = axes[0][0]
    width = 0.38
    this_label = "speculative" if report["speculative"] else "this run"
    if report["mode"] == "baseline":
        this_label = "baseline (this run)"
    if any(b is not None for b in baseline):
        ax.bar([p - width / 2 for p in positions], [b or 0.0 for b in baseline], width, label="baseline",
               color="#9e9e9e")
        bars = ax.bar([p + width / 2 for p in positions], current, width, label=this_label, color="#1f77b4")
        for bar, row in zip(bars, rows, strict=True):
            speedup = value(row, "speedup")
            if speedup is not None:
                ax.annotate(f"{speedup:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
    else:
        ax.bar(positions, current, width * 1.5, label=this_label + " (no baseline)", color="#1f77b4")
    ax.set_xticks(positions, labels)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s (bench client)")
    ax.set_title("Output throughput")
    ax.legend(fontsize=8)
    if show_accept:
        ax2 = axes[0][1]
        ax2.bar(positions, [a or 0.0 for a in accept], width * 1.5, color="#2ca02c")
        ax2.set_xticks(positions, labels)
        ax2.set_ylim(0, 1)
        ax2.set_xlabel("concurrency")
        ax2.set_ylabel("accept rate (Δ /metrics over window)")
        ax2.set_title("Draft acceptance")
    title = f"{report['host']} · {report['engine']} · {report['profile']} · {report['timestamp']}"
    if report["engine_is_test_double"]:
        title = "ENGINE TEST DOUBLE — " + title
    fig.suptitle(title, fontsize=9, color="#b00020" if report["engine_is_test_double"] else "black")
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--check", action="store_true", help="only check that matplotlib is importable")
    args = parser.parse_args(argv)
    if args.check:
        load_pyplot()
        return 0
    draw(json.loads(args.report.read_text(encoding="utf-8")), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
