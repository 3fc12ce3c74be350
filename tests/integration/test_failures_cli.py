"""``twinflow failures`` over Redis and through a peer's gRPC Admin service (a CLI process of its
own against a server in this one), and a publisher reading its notices with a cursor across a
reconnect of its client. Real redis-server and real gRPC sockets throughout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from tests.integration.test_audit_store import BROKEN, CALLS, FLOW, Master, publish
from twinflow.cli import main
from twinflow.client import Client
from twinflow.cluster.flow_failures import FlowFailures
from twinflow.cluster.grpc_server import AdminServicer, IngestServicer, create_server
from twinflow.cluster.ingest_bodies import read_bodies
from twinflow.runtime.flowgraph import load_graph
from twinflow.runtime.resubmit import envelope
from twinflow.runtime.store.audit import AuditStore

ROOT = Path(__file__).parents[2]


@pytest.fixture(autouse=True)
def service():
    CALLS.clear(), BROKEN.clear()


@pytest.fixture
def flow_file(tmp_path, flow_name) -> str:
    path = tmp_path / "flow.yaml"
    path.write_text(FLOW.replace("flow: f\n", f"flow: {flow_name}\n"))
    return str(path)


def failed_three(store) -> tuple[list[str], Master]:
    """o1 and o2 fail at the action, x1 at the join; their audit IDs in order."""
    BROKEN.update({"o1", "o2"})
    publish(store, {"id": "o1", "type": "order"}, {"id": "o2", "type": "order"}, {"id": "x1"})
    master = Master(store)
    master.run(1.0)
    BROKEN.clear()
    return [e.id for e in AuditStore(store).entries()], master


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main(["failures", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_show_resubmit_and_discard_over_redis(capsys, redis_url, flow_file, store):
    (o1, o2, x1), master = failed_three(store)
    code, out, _ = cli(capsys, "list", flow_file, "--redis", redis_url)
    assert code == 0 and [line.split()[0] for line in out.splitlines()[2:]] == [o1, o2, x1]
    code, out, _ = cli(capsys, "list", flow_file, "--redis", redis_url, "--node", "deliver", "--json")
    assert [e["audit_id"] for e in json.loads(out)["entries"]] == [o1, o2]
    code, out, _ = cli(capsys, "list", flow_file, "--redis", redis_url, "--reason", "no field 'type'")
    assert [line.split()[0] for line in out.splitlines()[2:]] == [x1]

    code, out, _ = cli(capsys, "resubmit", flow_file, o1, "--redis", redis_url, "--by", "ops-anna")
    assert code == 0 and f"{o1}: resubmitted by ops-anna (uplink " in out and "1 resubmitted, 0 refused" in out
    code, out, err = cli(capsys, "resubmit", flow_file, o1, "--redis", redis_url, "--by", "ops-ben")
    assert code == 1 and f"{o1} was already resubmitted at " in err and "by ops-anna; nothing changed" in err
    uplink = store.r.xlen(store.keys.uplink)
    code, out, err = cli(capsys, "discard", flow_file, "1700000000000-0", "--redis", redis_url)
    assert code == 1 and "has no audit entry '1700000000000-0'" in err and "0 discarded, 1 refused" in out
    assert store.r.xlen(store.keys.uplink) == uplink and store.r.hlen(store.keys.audit_marks) == 1

    master.run(2.0)
    assert CALLS == ["o1", "o2", "o1"]  # the resubmit ran once more
    code, out, _ = cli(capsys, "show", flow_file, o1, "--redis", redis_url)
    assert code == 0 and "status       RESUBMITTED" in out and "by ops-anna" in out
    assert "outcome      left by deliver.done" in out and '{"id": "o1", "type": "order"}' in out

    code, out, _ = cli(capsys, "discard", flow_file, "--all", "--node", "check", "--redis", redis_url, "--by", "b")
    assert code == 0 and f"{x1}: discarded by b" in out
    code, out, _ = cli(capsys, "list", flow_file, "--redis", redis_url, "--status", "any", "--json")
    assert {e["audit_id"]: e["status"] for e in json.loads(out)["entries"]} == {
        o1: "RESUBMITTED", o2: "FAILED", x1: "DISCARDED"}


def test_bad_flags_are_refused_before_anything_is_done(capsys, redis_url, flow_file, store):
    (o1, _, _), _ = failed_three(store)
    for args, words in ((("resubmit", flow_file), "name audit IDs, or pass --all"),
                        (("resubmit", flow_file, o1, "--all"), "not both"),
                        (("list", flow_file, "--since", "last tuesday"), "is not a time"),
                        (("show", flow_file), "name one audit ID")):
        code, _, err = cli(capsys, *args, "--redis", redis_url)
        assert code == 2 and words in err
    code, _, err = cli(capsys, "show", flow_file, "1-0", "--redis", redis_url)
    assert code == 1 and "has no audit entry '1-0'" in err
    assert store.r.hlen(store.keys.audit_marks) == 0


@pytest.fixture
def peer(flow_file, store):
    """A peer's Ingest and Admin services on a real port, over the flow's store."""
    graph = load_graph(flow_file)
    spec = graph.cluster

    def publish_bodies(bodies, deadline_s, publisher=""):
        ids = read_bodies(bodies, spec.message, publisher)
        return store.publish(bodies, deadline_s, publisher=publisher, message_ids=[i for i in ids if i])

    def failures():
        return FlowFailures(graph.name, [store], max_bytes=spec.message.max_bytes)

    server, port = create_server("127.0.0.1:0", ingest=IngestServicer(graph.name, publish_bodies, failures=failures),
                                 admin=AdminServicer(dict, dict, failures=failures))
    yield f"127.0.0.1:{port}"
    server.stop(None).wait()


def test_the_cli_in_a_process_of_its_own_goes_through_the_peers_admin_service(flow_file, store, peer):
    (o1, o2, x1), master = failed_three(store)

    def twinflow(*args):
        return subprocess.run([sys.executable, "-m", "twinflow.cli", "failures", *args, "--peer", peer],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)

    listed = twinflow("list", flow_file, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(e["audit_id"], e["node"]) for e in json.loads(listed.stdout)["entries"]] == [
        (o1, "deliver"), (o2, "deliver"), (x1, "check")]
    done = twinflow("resubmit", flow_file, "--all", "--node", "deliver", "--by", "ops-anna")
    assert done.returncode == 0 and "2 resubmitted, 0 refused" in done.stdout, done.stderr
    again = twinflow("resubmit", flow_file, o1, "9-9")
    assert again.returncode == 1 and "already resubmitted" in again.stderr and "no audit entry '9-9'" in again.stderr
    master.run(2.0)
    assert sorted(CALLS) == ["o1", "o1", "o2", "o2"]  # each ran exactly once more
    shown = twinflow("show", flow_file, o2)
    assert shown.returncode == 0 and "left by deliver.done" in shown.stdout and "by ops-anna" in shown.stdout
    with Client(peer, store.keys.flow) as client:
        assert client.failure(o1)["outcome"]["outlink"] == "done"
        with pytest.raises(grpc.RpcError) as err:
            client.failure("5-5")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_publisher_reads_its_notices_with_a_cursor_across_a_reconnect(store, peer):
    BROKEN.update({"a1", "a2", "a3", "k1"})
    flow = store.keys.flow
    with Client(peer, flow) as shop:
        shop.publish([{"id": f"a{n}", "type": "order"} for n in (1, 2, 3)], publisher="shop")
    with Client(peer, flow) as kiosk:
        kiosk.publish([{"id": "k1", "type": "order"}], publisher="kiosk")
    master = Master(store)
    master.run(1.0)
    with Client(peer, flow) as shop:
        first, cursor = shop.notices("shop", max_count=2)
    assert [(n["id"], n["node"], n["outlink"], n["publisher"]) for n in first] == [
        ("a1", "deliver", "error", "shop"), ("a2", "deliver", "error", "shop")]
    with Client(peer, flow) as shop:  # a new client, the cursor kept
        rest, cursor = shop.notices("shop", after=cursor)
        assert [n["id"] for n in rest] == ["a3"] and "refused a3" in rest[0]["reason"]
        assert shop.notices("shop", after=cursor) == ([], cursor)
        BROKEN.add("a4")
        shop.publish([{"id": "a4", "type": "order"}], publisher="shop")
        master.run(2.0)
        assert [n["id"] for n in shop.notices("shop", after=cursor)[0]] == ["a4"]
        assert [n["id"] for n in shop.notices("kiosk")[0]] == ["k1"]


def test_the_ingest_refuses_a_resubmit_envelope_and_a_bad_publisher(store, peer):
    with Client(peer, store.keys.flow) as client:
        for bodies, publisher, words in (([envelope("1-0", "deliver", {"id": "o"})], None, "resubmit envelope"),
                                         ([{"id": "o"}], "two words", "publisher 'two words' must be")):
            with pytest.raises(grpc.RpcError) as err:
                client.publish(bodies, publisher=publisher)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and words in err.value.details()
    assert store.r.exists(store.keys.uplink) == 0  # nothing was written
