"""`twinflow demo --json`, as `make demo` runs it: its own services, two peers, the chained flow
(history -> AND join -> action), one SIGKILL of the master."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.cluster


def test_demo_json_reports_exactly_once_delivery():
    r = subprocess.run([sys.executable, "-m", "twinflow.cli", "demo", "--json", "--messages", "1500",
                        "--rate", "500"], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    assert {"sent", "delivered", "lost", "duplicated", "failover_s"} <= result.keys()
    assert result["sent"] == result["delivered"] == 1500
    assert result["lost"] == 0 and result["duplicated"] == 0
    assert result["failover_s"] is not None and result["failover_s"] > 0
    assert result["new_master"] != result["killed"]
    # 750 orders: 600 joined with their payment, 75 sent twice (the history's duplicate, the
    # order then waits alone), 75 without payment plus 75 lone orders: every one expires.
    assert result["outlinks"] == {"deliver.done": 600, "guard.duplicate": 75, "match.expired": 225}
