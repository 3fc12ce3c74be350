"""The master's per-batch breakdown as a picture: from a ``twinflow bench flow-vs-passthrough
--json`` line, one chart per load (the bursts, the steady 2,000 msg/s), a bar per lane of the
batch (Spark's thread, the batch thread) cut into its phases at p50, with each phase's p99
written beside it (``cluster/batch_phases.py`` says what each phase is).

    .venv/bin/python bench/batch_breakdown.py bench/results/flow_vs_passthrough.jsonl docs/images/batch-breakdown.png

The last line of the file is drawn. Needs matplotlib (the ``chaos`` extra).
"""

import argparse
import json
from pathlib import Path

from twinflow.cluster.batch_phases import BATCH_PHASES, SPARK_PHASES

COLOURS = {"spark": "#9e9e9e", "read": "#64b5f6", "wait_previous": "#e0e0e0", "handled": "#4db6ac",
           "idle": "#eeeeee", "decode": "#ffb74d", "state_load": "#a1887f", "graph": "#81c784",
           "commit": "#e57373", "escalation": "#ba68c8", "other": "#fff176"}


def draw(record: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    loads = [(name, b) for name, b in record["breakdown"].items() if b.get("batches")]
    fig, axes = plt.subplots(len(loads), 1, figsize=(11, 2.3 * len(loads) + 0.6), squeeze=False)
    for ax, (name, b) in zip(axes[:, 0], loads):
        for row, (lane, phases) in enumerate((("batch thread", BATCH_PHASES), ("Spark's thread", SPARK_PHASES))):
            left = 0.0
            for phase in phases:
                width = b[phase]["p50_ms"]
                if width <= 0:
                    continue
                ax.barh(row, width, left=left, color=COLOURS[phase], edgecolor="#555555", linewidth=0.5)
                if width > 0.06 * max(1.0, total(b, BATCH_PHASES), total(b, SPARK_PHASES)):
                    ax.text(left + width / 2, row, f"{phase}\n{width:.0f} (p99 {b[phase]['p99_ms']:.0f})",
                            ha="center", va="center", fontsize=7)
                left += width
        ax.set_yticks([0, 1], ["batch thread", "Spark's thread"])
        ax.set_xlabel("ms per batch, p50 of each phase (p99 in brackets)")
        what = "bursts of {:,}".format(record["messages"]) if name == "bursts" else f"{record['rate']:.0f} msg/s"
        ax.set_title(f"the master's batches, {what}: {b['batches']} batches, {b['entries_p50']:,.0f} entries "
                     f"at p50", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[p]) for p in (*SPARK_PHASES, *BATCH_PHASES)]
    fig.legend(handles, [*SPARK_PHASES, *BATCH_PHASES], loc="lower center", ncol=6, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def total(b: dict, phases) -> float:
    return sum(b[p]["p50_ms"] for p in phases)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", type=Path, help="a file of twinflow bench flow-vs-passthrough --json lines")
    ap.add_argument("out", type=Path, help="the PNG to write")
    args = ap.parse_args()
    lines = [line for line in args.results.read_text().splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"{args.results}: no result line")
    draw(json.loads(lines[-1]), args.out)
    print(args.out)


if __name__ == "__main__":
    main()
