"""What a drill run looked like: a PNG timeline per drill and a Markdown report linking them.

:func:`timeline` reduces a drill's outputs to what the picture needs: every
write (when, by which peer), the first write of each epoch (a role change:
that peer became master) and the fault windows. :func:`timeline_png` draws
messages per second per peer, a line per role change and a band per fault
window (matplotlib, no display needed). :func:`write_report` writes one
PNG per drill and ``report.md`` with the results table, the drills that did
not apply to the flow and why, the rerun command of every failed drill and
the pictures.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

PEER_COLOURS = {"a": "tab:blue", "b": "tab:orange"}


def timeline(outputs: dict, windows: list[list]) -> dict:
    """Writes (ms, peer), role changes (ms, peer, epoch) and windows (start ms, end ms, what)."""
    writes = sorted((e.written_ms, e.peer, e.epoch) for entries in outputs.values() for e in entries)
    roles, seen = [], set()
    for ms, peer, epoch in writes:
        if epoch not in seen:
            seen.add(epoch)
            roles.append((ms, peer, epoch))
    end = writes[-1][0] if writes else int(time.time() * 1000)
    spans = [(int(s * 1000), int(e * 1000) if e is not None else end, what) for s, e, what in windows]
    return {"writes": [(ms, peer) for ms, peer, _ in writes], "roles": roles, "windows": spans}


def timeline_png(result: dict, path: Path) -> Path:
    """Draw ``result["timeline"]`` (see :func:`timeline`) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = result["timeline"]
    starts = [ms for ms, _ in tl["writes"][:1]] + [s for s, _, _ in tl["windows"]]
    t0 = min(starts) if starts else 0
    fig, ax = plt.subplots(figsize=(10, 4), dpi=100)
    for peer in sorted({n for _, n in tl["writes"]}):
        per_s = Counter(int((ms - t0) / 1000) for ms, n in tl["writes"] if n == peer)
        xs = list(range(0, max(per_s) + 2)) if per_s else []
        ax.step(xs, [per_s.get(x, 0) for x in xs], where="post", label=f"peer {peer}",
                color=PEER_COLOURS.get(peer))
    top = ax.get_ylim()[1] or 1
    for s, e, what in tl["windows"]:
        x0, x1 = (s - t0) / 1000, (e - t0) / 1000
        if x1 - x0 < 0.05:
            ax.axvline(x0, color="red", linewidth=1.5)
        else:
            ax.axvspan(x0, x1, color="red", alpha=0.15)
        ax.text(x0, top * 0.97, what, color="red", fontsize=7, rotation=90, va="top", ha="right")
    for ms, peer, epoch in tl["roles"]:
        x = (ms - t0) / 1000
        ax.axvline(x, color=PEER_COLOURS.get(peer, "grey"), linestyle="--", linewidth=1)
        ax.text(x, top * 0.5, f"{peer} master, epoch {epoch}", fontsize=7, rotation=90, va="center",
                color=PEER_COLOURS.get(peer, "grey"))
    verdict = "passed" if result.get("passed") else "FAILED"
    ax.set_title(f"{result['drill']} (seed {result['seed']}, {result['messages']} messages): {verdict}, "
                 f"lost {result['lost']}, duplicated {result['duplicated']}, RTO {result['rto_s']} s", fontsize=9)
    ax.set_xlabel("seconds since the first write")
    ax.set_ylabel("messages out per second")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write_report(results: list[dict], directory: Path, columns: list[str],
                 not_applicable: dict[str, str] | None = None) -> Path:
    """A PNG per drill result and ``report.md`` (the table, the drills that did not apply to the
    flow and why, reruns, pictures); returns the report."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["# Chaos drills", "", f"Run {time.strftime('%Y-%m-%d %H:%M:%S %Z')}.", "",
             "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    after_table = [""] + [f"- {name}: not applicable: {why}" for name, why in (not_applicable or {}).items()]
    pictures = []
    for r in results:
        lines.append("| " + " | ".join(str(r.get(c)) for c in columns) + " |")
        if "timeline" in r:
            png = timeline_png(r, directory / f"{r['drill']}-seed{r['seed']}.png")
            pictures += [f"## {r['drill']}", "", f"![{r['drill']}]({png.name})", ""]
            if not r.get("passed"):
                pictures[-1:-1] = [f"FAILED; rerun: `{r['rerun']}`", ""]
    report = directory / "report.md"
    report.write_text("\n".join(lines + after_table + [""] + pictures) + "\n")
    return report
