"""`twinflow simulate --flow` on a flow that names its fields its own way: the producer publishes
messages made from the flow's fields (twinflow/testing/flow_messages.py), or copies of
`--samples`, and a flow whose messages cannot be made up is refused in one line naming the
field. The drills' recovery time is measured from the fault (twinflow/testing/checker.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from twinflow.chaos.sim.simulator import run_once, simulate
from twinflow.testing.checker import SinkEntry, check

SHARDED = Path(__file__).resolve().parents[2] / "examples" / "cluster-sharded.yaml"
RENAMES = (('shard_key: "{order_id}"', 'shard_key: "{oid}"'), ("message: {id: id,", "message: {id: mid,"),
           ("uuid: uuid ", "uuid: ref "), ("type_field: type", "type_field: kind"),
           ("activation_field: order_id", "activation_field: oid"), ("key: seq", "key: n"))

RULESETS = """
flow: rules
uplink: {stream: uplink}
message: {id: meta.id}
input: deliver
nodes:
  deliver: {type: action, sink: {stream: sink}}
  claims:
    type: sort
    pairs_with: deliver
    rulesets:
      - {name: refs, match: {field: doc.kind, regex: "^(a)\\\\1$"}, key: "{n}", bake_time: 5}
      - {name: rest, key: "{n}", bake_time: 3}
cluster: {session_timeout: 2.0}
"""


def renamed(tmp_path: Path) -> Path:
    text = SHARDED.read_text()
    for old, new in RENAMES:
        text = text.replace(old, new)
    path = tmp_path / "renamed.yaml"
    path.write_text(text)
    return path


def test_a_sharded_flow_with_its_own_field_names_keeps_every_promise(tmp_path):
    # Before: every run failed with "a good message left by the failure path: message has no ID field 'mid'".
    text = renamed(tmp_path).read_text()
    out = simulate(seed=1, runs=20, jobs=2, flow_text=text)
    assert out["failures"] == [], [(r.seed, r.problems) for r in out["failures"]]
    assert out["runs"] == 20 and out["kind"] == "sharded" and out["lost"] == 0 and out["duplicated"] == 0
    assert out["counts"]["resent"] > 0 and out["counts"]["promotions_warm"] > 0  # re-sends hit the history
    r = run_once(3, flow_text=text, messages=10)
    assert r.passed and "messages: messages made from the flow's fields" in r.trace[1]
    assert any("(m000000.." in line for line in r.trace)


def test_a_flow_whose_messages_cannot_be_made_up_is_refused_and_runs_on_samples(tmp_path):
    flow = tmp_path / "rules.yaml"
    flow.write_text(RULESETS)
    cmd = [sys.executable, "-m", "twinflow.cli", "simulate", "--flow", str(flow), "--runs", "3", "--jobs", "1",
           "--json"]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "field 'doc.kind'" in refused.stderr and "--samples FILE" in refused.stderr
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"meta": {"id": "s1"}, "n": 1, "doc": {"kind": "aa"}}\n'
                       '{"meta": {"id": "s2"}, "n": 2, "doc": {"kind": "b"}}\n')
    ran = subprocess.run(cmd + ["--samples", str(samples)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr[-2000:]
    out = json.loads(ran.stdout)
    assert out["runs"] == 3 and out["failed"] == 0 and out["sent"] == 3 * 40


def test_recovery_is_measured_from_the_fault_to_the_first_write_after_it():
    ms, fault = 1_800_000_000_000, 1_800_000_005.0
    # The redis-latency drill: the master (a, epoch 1) wrote nothing before it was killed; its
    # COMMIT in flight landed 0.1 s after the kill; b (epoch 2) first wrote 1.3 s after it.
    late = {"deliver.done": [SinkEntry("m1", 1, "a", ms + 5_100), SinkEntry("m2", 2, "b", ms + 6_300),
                             SinkEntry("m3", 2, "b", ms + 6_400)]}
    report = check(late, ["m1", "m2", "m3"], [fault])
    assert report.promises_kept and abs(report.rto_s - 1.3) < 1e-6
    # A master that wrote before: from the fault (not from its last write) to the new epoch's first.
    usual = {"deliver.done": [SinkEntry("m1", 1, "a", ms + 1_000), SinkEntry("m2", 1, "a", ms + 5_050),
                              SinkEntry("m3", 2, "b", ms + 7_000)]}
    assert abs(check(usual, ["m1", "m2", "m3"], [fault]).rto_s - 2.0) < 1e-6
    # The same master writing on (no failover): to its next write.
    assert abs(check({"s": usual["deliver.done"][:2]}, ["m1", "m2"], [fault]).rto_s - 0.05) < 1e-6
    # Two faults: the longer recovery; nothing written after one of them: no recovery (a failure).
    assert abs(check(usual, ["m1", "m2", "m3"], [fault, 1_800_000_006.5]).rto_s - 2.0) < 1e-6
    assert check(usual, ["m1", "m2", "m3"], [fault, 1_800_000_009.0]).rto_s is None
    assert check({"s": []}, [], [fault]).rto_s is None
