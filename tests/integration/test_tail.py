"""``twinflow tail``, run as a user runs it (a subprocess), on a real Redis: it prints the entries
the test publishes as JSON lines, acknowledges them as a group's consumer, stops after --count or
on SIGTERM with status 0, and names the streams it knows when given another."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys

import pytest
import redis

from twinflow.cli import main

FLOW = """\
flow: {name}
uplink: {{stream: uplink}}
nodes:
  guard: {{type: history, uuid: u, retention: 60, links: {{new: deliver}}}}
  deliver: {{type: action, sink: {{stream: sink}}}}
"""


@pytest.fixture
def flow(tmp_path, flow_name, redis_url):
    path = tmp_path / "flow.yaml"
    path.write_text(FLOW.format(name=flow_name))
    return str(path), redis.Redis.from_url(redis_url), f"tf:{{{flow_name}}}:"


def tail(*args, redis_url, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "twinflow.cli", "tail", *args, "--redis", redis_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines()]


def test_tail_prints_each_entry_and_stops_after_count(flow, redis_url):
    path, r, prefix = flow
    ids = [r.xadd(prefix + "sink", {"id": f"m{i}", "data": '{"n": %d}' % i}).decode() for i in range(3)]
    proc = tail("sink", path, "--from-start", "--count", "2", redis_url=redis_url)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert lines(out) == [{"stream": "sink", "id": ids[i], "fields": {"id": f"m{i}", "data": '{"n": %d}' % i}}
                          for i in range(2)]


def test_tail_as_a_groups_consumer_acknowledges_what_it_printed(flow, redis_url):
    path, r, prefix = flow
    key = prefix + "out:guard:duplicate"
    r.xgroup_create(key, "audit-copy", id="$", mkstream=True)
    ids = [r.xadd(key, {"id": f"d{i}"}).decode() for i in range(3)]
    proc = tail("guard.duplicate", path, "--group", "audit-copy", "--consumer", "c1", "--count", "2",
                redis_url=redis_url)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert [e["id"] for e in lines(out)] == ids[:2]
    assert all(e["stream"] == "out:guard:duplicate" for e in lines(out))
    group = r.xinfo_groups(key)[0]
    assert (group["pending"], group["last-delivered-id"].decode()) == (0, ids[1])  # read and acknowledged


def test_tail_follows_new_entries_until_sigterm(flow, redis_url):
    path, r, prefix = flow
    r.xadd(prefix + "sink", {"id": "old"})
    proc = tail("deliver.done", path, redis_url=redis_url)
    try:
        # It reads only what comes after its start: publish until the first line shows.
        seen = ""
        for i in range(100):
            r.xadd(prefix + "sink", {"id": f"new{i}"})
            if select.select([proc.stdout], [], [], 0.1)[0]:
                seen = proc.stdout.readline()
                break
        assert json.loads(seen)["fields"]["id"].startswith("new")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 0 and "Traceback" not in err
    assert all(e["fields"]["id"] != "old" for e in lines(out))


def test_an_unknown_stream_is_refused_naming_the_streams_known(flow, capsys):
    path, _, _ = flow
    assert main(["tail", "sinks", path, "--redis", "redis://127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err
    assert "has no stream 'sinks' (its streams: failure, notices, out:deliver:error, out:deliver:failure, " \
           "out:guard:duplicate, out:guard:failure, out:guard:in_doubt, sink, uplink;" in err


def test_a_group_that_does_not_exist_is_named_with_the_command_that_makes_it(flow, redis_url, capsys):
    path, _, prefix = flow
    assert main(["tail", "sink", path, "--redis", redis_url, "--group", "g", "--consumer", "c", "--count", "1"]) == 1
    assert f"XGROUP CREATE {prefix}sink g $" in capsys.readouterr().err


def test_from_start_a_consumer_first_prints_what_it_was_given_and_never_acknowledged(flow, redis_url):
    path, r, prefix = flow
    key = prefix + "sink"
    ids = [r.xadd(key, {"id": f"m{i}"}).decode() for i in range(3)]
    r.xgroup_create(key, "billing", id="0")
    r.xreadgroup("billing", "c1", {key: ">"}, count=2)  # given m0 and m1; c1 stopped before acknowledging
    r.xtrim(key, minid=ids[1], approximate=False)  # the retention removed m0 meanwhile
    proc = tail("sink", path, "--group", "billing", "--consumer", "c1", "--from-start", "--count", "3",
                redis_url=redis_url)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert [(e["id"], e["fields"]) for e in lines(out)] == [(ids[0], None), (ids[1], {"id": "m1"}),
                                                            (ids[2], {"id": "m2"})]
    assert r.xinfo_groups(key)[0]["pending"] == 0
