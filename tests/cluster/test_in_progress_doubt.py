"""A second copy of an order while its first run is still under way, on a real pair
(examples/cluster-guarded.yaml with a handler that holds chosen messages in their retries): the
copy is In Doubt and goes to the resolver, told the run is in progress; the handler runs a second
time only for the copy the resolver answers `new`, and the first run's end, on the master
promoted meanwhile, does not complete the second run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.cluster.harness import cluster_on
from tests.conftest import wait_until
from twinflow.chaos import guarded_drills
from twinflow.runtime.nodes.history import IN_PROGRESS

pytestmark = pytest.mark.cluster

# Next to the flow file: the ledger's handler, except that a message is held in its retries
# (a transient error, before the ledger is called) while ledger/hold/<id> exists; and the
# ledger's resolver, except that a copy asking to run again (`run_again`) is answered `new`, and
# so is an attempt of a held message a dead master left in doubt (held, it never reached the
# ledger, whatever the ledger holds for its order meanwhile).
COPIES = '''
import ledger_handlers
from twinflow.runtime.nodes.action import TransientError
from twinflow.runtime.nodes.history import NEW


def held(msg):
    return (ledger_handlers.ledger() / "hold" / msg.id).exists()


def book(msg, attempt):
    if held(msg):
        raise TransientError("held")
    ledger_handlers.book(msg, attempt)


def resolve(msg, doubt):
    if msg.doc.get("run_again") or held(msg):
        ledger_handlers._note("resolved.jsonl", {"uuid": doubt.uuid, "id": msg.id, "verdict": NEW,
                                                 "reason": doubt.reason})
        return NEW
    return ledger_handlers.resolve(msg, doubt)
'''


def left(cluster, outlink: str) -> list[str]:
    return [e.id for name, entries in cluster.outputs().items() if name == outlink for e in entries]


def info(cluster, stream: str, mid: str) -> dict:
    [fields] = [f for _, f in cluster.stream(stream) if f["id"] == mid]
    return json.loads(fields["info"])


def history(cluster) -> dict:
    return {k.decode(): json.loads(v) for k, v in cluster.redis.hgetall(cluster.keys.state("guard")).items()}


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def test_a_copy_of_a_run_in_progress_goes_to_the_resolver_and_runs_again_only_when_it_says_new(
        tmp_path, services, flow_name, monkeypatch):
    monkeypatch.setenv("TWINFLOW_LEDGER", "")  # restored after the test: prepare() sets both
    monkeypatch.setenv("TWINFLOW_LEDGER_DELAY_MS", "0")
    ledger = guarded_drills.prepare(tmp_path, delay_ms=0)
    (tmp_path / "copies.py").write_text(COPIES)
    hold = ledger / "hold"
    hold.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (guarded_drills.GUARDED_FLOW.read_text()
            .replace('handler: "ledger_handlers:book"', 'handler: "copies:book"')
            .replace('resolver: "ledger_handlers:resolve"', 'resolver: "copies:resolve"')
            .replace("max_retries: 3", "max_retries: 100000"))  # held messages retry, never suspend
    assert "copies:book" in text and "copies:resolve" in text and "100000" in text
    cluster = cluster_on(services, tmp_path, flow_name, text=text)
    try:
        cluster.peer("a")
        wait_until(lambda: cluster.status("a").get("role") == "master", 90, what="a master")
        cluster.peer("b")
        wait_until(lambda: cluster.status("b").get("streaming") == "1", 90, what="the worker streaming")

        for mid in ("m1", "m2", "m4"):
            (hold / mid).touch()
        cluster.publish([{"id": "m1", "uuid": "keep-1", "seq": 1}, {"id": "m2", "uuid": "again-1", "seq": 2}])
        # Both runs under way: the steps that ran them committed their "processing" entries.
        wait_until(lambda: all(history(cluster).get(f'["guard", "{u}"]', [0, False, True])[1:] == [True, False]
                               for u in ("keep-1", "again-1")), 60, what="both first runs under way")

        cluster.publish([{"id": "m3", "uuid": "keep-1", "seq": 3},
                         {"id": "m4", "uuid": "again-1", "seq": 4, "run_again": True}])
        wait_until(lambda: "m3" in left(cluster, "guard.duplicate"), 60, what="m3 decided")
        wait_until(lambda: history(cluster).get('rerun:["guard", "again-1"]') == "m4", 60,
                   what="m4 running again over m2's run")
        assert info(cluster, "out:guard:duplicate", "m3") == {"reason": IN_PROGRESS, "resolver": "duplicate"}
        asked = [(r["id"], r["verdict"]) for r in lines(ledger / "resolved.jsonl") if r.get("reason") == IN_PROGRESS]
        assert asked == [("m3", "duplicate"), ("m4", "new")]
        # The journal says which case it was.
        wait_until(lambda: "message 'm3' (uuid 'keep-1') is in_doubt: " + IN_PROGRESS in
                   Path(cluster.peers["a"].log_path).read_text(errors="replace"), 30, what="m3's journal entry")
        assert lines(ledger / "calls.jsonl") == []  # every run still held in its retries

        cluster.peers["a"].kill()  # m1, m2 and m4 wait for their retries on the new master
        wait_until(lambda: cluster.status("b").get("role") == "master", 60, what="b promoted")
        (hold / "m2").unlink()
        wait_until(lambda: "m2" in left(cluster, "book.done"), 60, what="m2's run ended")
        # m2's end was not m4's: the history still holds m4's run as under way, m4 its message.
        state = history(cluster)
        assert state['["guard", "again-1"]'][1:] == [True, False]
        assert state['rerun:["guard", "again-1"]'] == "m4"
        cluster.publish([{"id": "m5", "uuid": "again-1", "seq": 5}])
        wait_until(lambda: "m5" in left(cluster, "guard.duplicate"), 60, what="m5 decided")
        assert info(cluster, "out:guard:duplicate", "m5") == {"reason": IN_PROGRESS, "resolver": "duplicate"}

        (hold / "m1").unlink()
        (hold / "m4").unlink()
        wait_until(lambda: {"m1", "m4"} <= set(left(cluster, "book.done")), 60, what="m1 and m4 booked")
        assert sorted(left(cluster, "book.done")) == ["m1", "m2", "m4"]  # each once
        assert sorted(left(cluster, "guard.duplicate")) == ["m3", "m5"]
        # The handler ran twice only for the order the resolver sent to run again.
        assert Counter(c["uuid"] for c in lines(ledger / "calls.jsonl")) == {"keep-1": 1, "again-1": 2}
        verdict = guarded_drills.ledger_verdict(ledger)
        assert verdict["booked"] == 2 and verdict["double_booked"] == 1 and verdict["repeated_calls"] == 0
        assert verdict["in_doubt_in_progress"] == 3
        state = history(cluster)
        assert state['["guard", "again-1"]'][1:] == [True, True] and 'rerun:["guard", "again-1"]' not in state
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()
