"""Runs every node benchmark (bench/node_*.py) one after the other, each in its own process.

Each appends its figures to bench/results/nodes.jsonl; this prints them as a table.

    .venv/bin/python bench/nodes.py
"""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def main() -> int:
    failed = 0
    for script in sorted(HERE.glob("node_*.py")):
        r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
        if r.returncode != 0:
            failed += 1
            print(f"{script.name} failed:\n{r.stderr[-2000:]}", file=sys.stderr)
    rows = [json.loads(line) for line in (HERE / "results" / "nodes.jsonl").read_text().splitlines()]
    latest = {}
    for row in rows:
        latest[row["node"]] = row
    print(f"{'node':<12}{'msgs/s':>12}{'us @10':>10}{'us @10k':>10}{'ratio':>8}")
    for node, row in sorted(latest.items()):
        print(f"{node:<12}{row['throughput_msgs_s']:>12,.0f}{row['cost_us_at_10']:>10.2f}"
              f"{row['cost_us_at_10000']:>10.2f}{row['ratio']:>8.2f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
