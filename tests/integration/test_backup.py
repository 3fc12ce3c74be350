"""``twinflow backup`` and ``twinflow restore`` on real servers: a backup taken while master steps
commit is the state after one of them, restored into a fresh Redis whole (times to live kept) and
fenced above every epoch; each refusal says why and writes nothing; a peer does not start on a
restore under way, nor on a state directory older than the restore."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import redis
from kazoo.client import KazooClient

from twinflow.cli import main
from twinflow.cluster.master_flow import MasterFlow
from twinflow.cluster.on_cluster import StartRefused, flow_keys
from twinflow.cluster.start_position import check_restore
from twinflow.runtime.flowgraph import load_graph
from twinflow.runtime.message import Message
from twinflow.runtime.store.flow_keys import FlowKeys
from twinflow.runtime.store.flow_store import FlowStore
from twinflow.runtime.store import key_copy
from twinflow.runtime.store.key_copy import PauseOverrun, copy_keys
from twinflow.runtime.store.step import Step
from twinflow.runtime.store.store_errors import Fenced
from twinflow.testing.messages import order_or_payment

CHAINED = Path(__file__).parents[2] / "examples" / "cluster-chained.yaml"
PER_STEP = 10
ID_TTL = 86400  # the chained flow's message.id_ttl


def flow_file(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(CHAINED.read_text().replace("flow: orders", f"flow: {name}"))
    return str(path)


class Traffic:
    """A producer and a master on a thread: each round publishes messages of the chained flow
    and commits the step that runs them, as a peer's master does (``MasterFlow.run``,
    ``FlowStore.commit``); and what Redis held after each step: the state version ->
    (processed mark, sink length, history entries, open join groups, ID-cache keys). The
    uplink is left out: a publish is a write of its own, before the step."""

    def __init__(self, store: FlowStore, path: str, epoch: int = 3):
        self.store, self.epoch = store, epoch
        self.flow = MasterFlow.load(load_graph(path), store)
        self.after: dict[int, tuple] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        store.raise_epoch(epoch)

    def _run(self) -> None:
        r, keys, seq = self.store.r, self.store.keys, 0
        while not self.stop.is_set():
            docs = [order_or_payment(seq + i) for i in range(PER_STEP)]
            seq += PER_STEP
            bodies = [json.dumps(d).encode() for d in docs]
            positions = self.store.publish(bodies)
            msgs = [Message(d["id"], None, p, b, d) for d, p, b in zip(docs, positions, bodies)]
            step = self.flow.run(msgs, now=time.time(), epoch=self.epoch)
            self.store.commit(self.epoch, step)
            self.flow.committed(step)
            self.after[int(r.get(keys.version))] = self.seen(r, keys, ids=seq)

    @staticmethod
    def seen(r: redis.Redis, keys, ids: int) -> tuple:
        return r.get(keys.processed), r.xlen(keys.sink), r.hlen(keys.state("guard")), r.hlen(keys.state("match")), ids

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def wait_version(r: redis.Redis, keys, at_least: int) -> None:
    end = time.monotonic() + 20
    while int(r.get(keys.version) or 0) < at_least:
        assert time.monotonic() < end, "the master's steps did not commit"
        time.sleep(0.01)


def id_keys(r: redis.Redis, keys) -> list[bytes]:
    return list(r.scan_iter(match=keys.id_prefix + "*", count=1000))


@pytest.fixture
def source(tmp_path, flow_name, redis_url):
    path = flow_file(tmp_path, flow_name)
    store = FlowStore(redis.Redis.from_url(redis_url), flow_keys(load_graph(path)), "peer-a", id_ttl=ID_TTL)
    yield path, store
    store.close()


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_backup_under_traffic_restores_the_state_after_one_step(source, own_redis, redis_url, zk_hosts,
                                                                  tmp_path, capsys, monkeypatch):
    # The copy in scripts of 20 keys, so that it spans many steps' time: the pause, not a single
    # script, is what makes it one instant (without the pause this test fails most runs).
    monkeypatch.setattr(key_copy, "BATCH", 20)
    path, store = source
    r, keys = store.r, store.keys
    out = tmp_path / "flow.tfb"
    with Traffic(store, path) as traffic:
        wait_version(r, keys, 20)
        code, said, err = run(capsys, "backup", path, str(out), "--redis", redis_url)
        assert code == 0, err
        wait_version(r, keys, int(json.loads(out.read_bytes().partition(b"\n")[0])["shards"][0]["version"]) + 5)
    header = json.loads(out.read_bytes().partition(b"\n")[0])
    assert header["flow"] == keys.flow and header["keys"] > 100 and header["shards"][0]["epoch"] == 3
    assert f"wrote {out}" in said and "ms pause of its writes" in said

    port, _ = own_redis("--appendonly", "yes")  # a fresh Redis, as a rebuilt machine's
    target = redis.Redis(port=port)
    code, said, err = run(capsys, "restore", path, str(out), "--redis", f"redis://127.0.0.1:{port}",
                          "--zk", zk_hosts)
    assert code == 0, err
    assert "start every peer on a new state directory with --start-from processed" in said

    # One instant: what the restored Redis holds is what the source held after step `version`,
    # every key of it, and the source went on past it (the copy was taken mid-stream).
    version = int(target.get(keys.version))
    assert version == header["shards"][0]["version"] and version < int(r.get(keys.version))
    assert Traffic.seen(target, keys, ids=len(id_keys(target, keys))) == traffic.after[version]
    assert len(id_keys(target, keys)) == version * PER_STEP
    # The uplink: every entry published before the copy, the next step's perhaps too.
    restored = [entry_id for entry_id, _ in target.xrange(keys.uplink)]
    assert len(restored) in (version * PER_STEP, (version + 1) * PER_STEP)
    assert restored == [entry_id for entry_id, _ in r.xrange(keys.uplink, count=len(restored))]
    assert target.get(keys.processed).decode() == header["shards"][0]["processed"]
    # Times to live kept: the ID cache's (set at COMMIT, id_ttl), none on the mark.
    ttl = target.ttl(id_keys(target, keys)[0])
    assert ID_TTL - 120 < ttl <= ID_TTL
    assert target.ttl(keys.processed) == -1
    # Fenced above every epoch: the restore took one of its own from ZooKeeper.
    zk = KazooClient(hosts=zk_hosts)
    zk.start()
    try:
        zk_epoch = zk.exists(f"/twinflow/{keys.flow}/epoch").version
    finally:
        zk.stop()
        zk.close()
    assert int(target.get(keys.epoch)) == zk_epoch > 3
    assert target.get(keys.restoring) is None
    assert target.hget(keys.restored, "epoch") == str(zk_epoch).encode()
    stale = FlowStore(target, keys, "peer-a", id_ttl=ID_TTL)
    with pytest.raises(Fenced):  # the backup's master, still running somewhere, is refused
        stale.commit(3, Step(mark=header["shards"][0]["uplink_last"]))


def test_each_refusal_names_its_reason_and_writes_nothing(source, tmp_path, redis_url, zk_hosts, own_redis,
                                                          capsys):
    path, store = source
    out = tmp_path / "flow.tfb"
    with Traffic(store, path):
        wait_version(store.r, store.keys, 3)
    assert run(capsys, "backup", path, str(out), "--redis", redis_url)[0] == 0
    port, _ = own_redis()
    target = redis.Redis(port=port)
    into = ["--redis", f"redis://127.0.0.1:{port}", "--zk", zk_hosts]

    damaged = tmp_path / "damaged.tfb"
    data = bytearray(out.read_bytes())
    data[-10] ^= 0xFF
    damaged.write_bytes(bytes(data))
    code, _, err = run(capsys, "restore", path, str(damaged), *into)
    assert (code, err.count("\n")) == (4, 1) and "checksum does not match" in err

    other = flow_file(tmp_path, "another-flow")
    code, _, err = run(capsys, "restore", other, str(out), *into)
    assert code == 4 and f"is a backup of flow {store.keys.flow!r}, not of 'another-flow'" in err

    # The flow's own Redis holds its keys: only with --replace.
    code, _, err = run(capsys, "restore", path, str(out), "--redis", redis_url, "--zk", zk_hosts)
    assert code == 4 and "already holds" in err and "pass --replace" in err

    peer = FlowStore(target, store.keys, "peer-b")
    peer.write_status({"role": "worker"}, ttl_s=60)  # a peer that runs writes it twice a second
    code, _, err = run(capsys, "restore", path, str(out), *into, "--wait-stopped", "0.3")
    assert code == 4 and "peer peer-b of flow" in err and "its status in Redis" in err
    assert "stop every peer of the flow first" in err
    target.delete(store.keys.peer("peer-b"))

    zk = KazooClient(hosts=zk_hosts)
    zk.start()
    try:
        zk.create(f"/twinflow/{store.keys.flow}/members/peer-c", b"{}", ephemeral=True, makepath=True)
        code, _, err = run(capsys, "restore", path, str(out), *into, "--wait-stopped", "0.3")
        assert code == 4 and "peer peer-c of flow" in err and "a member in ZooKeeper" in err
    finally:
        zk.stop()
        zk.close()
    assert [k for k in target.keys("*") if not k.endswith(b":nodes")] == []  # nothing written by any refusal

    code, said, err = run(capsys, "restore", path, str(out), "--redis", redis_url, "--zk", zk_hosts, "--replace")
    assert code == 0, err
    assert "keys there before deleted" in said


def test_a_copy_that_would_outlast_its_pause_is_abandoned_and_the_writes_go_on(redis_url, flow_name):
    r = redis.Redis.from_url(redis_url)
    prefix = f"tf:{{{flow_name}}}:"
    r.mset({f"{prefix}id:{i}": i for i in range(3000)})
    # A bound of 60 s on Redis, passed on the copy's own clock after three looks (20 s each): a
    # pause left to its bound would hold the write below for a minute, past the client's time-out.
    ticks = iter(range(0, 10_000_000, 20_000))
    with pytest.raises(PauseOverrun) as raised:
        copy_keys(r, prefix, 60_000, monotonic=lambda: next(ticks) / 1000)
    assert raised.value.copied < 3000
    writer = redis.Redis.from_url(redis_url, socket_timeout=10)
    assert writer.set(prefix + "after", 1)  # the pause was ended, not left to its bound
    writer.close()


def test_a_peer_refuses_a_restore_under_way_and_a_state_directory_older_than_the_restore(
        source, tmp_path, redis_url, zk_hosts, capsys):
    path, store = source
    keys = store.keys
    old = SimpleNamespace(name=keys.flow, cfg=SimpleNamespace(state_dir=str(tmp_path / "a"), peer_id="peer-a"))
    new = SimpleNamespace(name=keys.flow, cfg=SimpleNamespace(state_dir=str(tmp_path / "b"), peer_id="peer-a"))
    began = tmp_path / "a" / keys.flow / "peer-a" / "start.json"
    began.parent.mkdir(parents=True)
    began.write_text(json.dumps({"id": "0-0", "n": 0}))  # peer-a has run here before
    check_restore(old, store)  # never restored: nothing to refuse

    out = tmp_path / "flow.tfb"
    with Traffic(store, path):
        wait_version(store.r, keys, 3)
    assert run(capsys, "backup", path, str(out), "--redis", redis_url)[0] == 0
    store.r.set(keys.restoring, json.dumps({"file": "flow.tfb", "at": "now"}))
    with pytest.raises(StartRefused, match="a restore into this Redis is under way or did not finish"):
        check_restore(new, store)
    code, _, err = run(capsys, "restore", path, str(out), "--redis", redis_url, "--zk", zk_hosts)
    assert code == 4 and "a restore of it did not finish" in err
    assert run(capsys, "restore", path, str(out), "--redis", redis_url, "--zk", zk_hosts, "--replace")[0] == 0

    with pytest.raises(StartRefused, match="Move the directory aside and start the peer on a new one"):
        check_restore(old, store)
    check_restore(new, store)  # a new directory begins on the restored state ...
    (tmp_path / "b" / keys.flow / "peer-a" / "start.json").write_text(json.dumps({"id": "0-0", "n": 0}))
    check_restore(new, store)  # ... and is taken again when the peer restarts


def test_a_sharded_flow_is_backed_up_and_restored_shard_by_shard(tmp_path, flow_name, redis_url, zk_hosts,
                                                                 own_redis, capsys):
    text = (Path(__file__).parents[2] / "examples" / "cluster-sharded.yaml").read_text()
    path = tmp_path / "sharded.yaml"
    path.write_text(text.replace("flow: orders", f"flow: {flow_name}"))
    r = redis.Redis.from_url(redis_url)
    for k in range(2):
        shard = FlowStore(r, FlowKeys(f"{flow_name}.s{k}"), "peer-a")  # each shard's keys, as the peers write them
        shard.raise_epoch(2 + k)
        shard.publish([json.dumps({"id": f"m{k}", "order_id": k}).encode()])
        r.set(shard.keys.id_prefix + f"m{k}", 1, ex=600)
    out = tmp_path / "sharded.tfb"
    code, said, err = run(capsys, "backup", str(path), str(out), "--redis", redis_url)
    assert code == 0, err
    assert f"{flow_name}.s0: 3 keys" in said and f"{flow_name}.s1: 3 keys" in said
    port, _ = own_redis()
    code, said, err = run(capsys, "restore", str(path), str(out), "--redis", f"redis://127.0.0.1:{port}",
                          "--zk", zk_hosts)
    assert code == 0, err
    target = redis.Redis(port=port)
    for k in range(2):
        prefix = f"tf:{{{flow_name}.s{k}}}:"
        assert target.xlen(prefix + "uplink") == 1 and 0 < target.ttl(prefix + f"id:m{k}") <= 600
        assert int(target.get(prefix + "epoch")) > 2 + k  # each shard fenced with an epoch of its own
