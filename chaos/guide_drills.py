"""The deployment guide's drills (``twinflow drill NAME --hosts``): the guide run as written on
three hosts (:class:`~twinflow_dev.guide_lab.GuideLab`), then one of its day-2 sections
run, again as written, while the client host publishes; judged by the one checker as the
other drills between hosts are (lost, duplicated, stale writes, RTO).

- ``guide``: the master's machine dies (every process of it: its peer, a Redis, a Sentinel, a
  ZooKeeper server); the other peer goes on; the machine comes back (its servers, then its
  peer through the unit) and rejoins as worker.
- ``rolling-upgrade``: "Upgrading twinflow": the backup first, then each peer's machine in
  turn, with a wheel of a newer version beside the installed one (the guide names the newest);
  every peer reports the new version. Then "Rolling back", once every message is out: both
  peers stopped, the old wheel installed again, the backup taken before the upgrade restored,
  the peers started on new state directories, and every message published again: each is in
  the restored flow's outputs once, and both peers report the old version.
- ``flow-change``: first a flow file ``validate`` refuses (a second ``cluster:`` key): the
  guide's block stops at ``validate``, the live file is unchanged and no peer restarted; then a
  flow file without the join, while the join holds open groups: the restarted worker refuses
  it, exit 4, with the node and what it holds, the master goes on, and the old file is put
  back; then "Changing a running flow" with a longer join time-out on each machine in turn and
  on the client host, and 400 messages more whose lone orders expire after the new time-out.
- ``rotation``: "Rotating certificates and tokens", the tokens' three steps (each peer accepts
  the old and the new, then everyone sends the new, then the old is refused; the operator's
  commands on the client host get in with the new admin token), then a new CA's (both CAs
  trusted, then the new certificates shown, then the old CA refused), each step a rolling
  restart checked with ``twinflow status --grpc``; then new certificates from the same CA (the
  guide's check that the CA outlives them by a year, a rolling restart, each peer's new end
  date read from its handshake); then a second publisher sends with the new token,
  certificate and CA, each message delivered once.
- ``backup-restore``: "Backing up and restoring a flow": a backup taken mid-stream; once every
  message is out, the peers are stopped, the flow's keys are lost (deleted), the backup is
  restored, the peers start on new state directories, and the producer sends everything again:
  every message is in the restored flow's outputs exactly once.
- ``topology-peer``, ``topology-redis``: "Changing the machines": the spare machine
  ``host-d.example`` installed (before the traffic), then, under traffic, a third peer
  ``peer-c`` added on it (all three stream, Prometheus scrapes three) and removed again (a
  peer's replacement is these two halves); a third Redis replica added (each Sentinel counts
  three) and removed again (each Sentinel reset, two).
- ``topology-zookeeper-add``, ``topology-zookeeper-remove``, ``topology-zookeeper``: the
  ensemble grown to four servers with host-d's, shrunk back to three, and server 3 moved from
  host-c to host-d (:mod:`.guide_zookeeper`).

One lab serves every guide drill of a series (it takes a few minutes to install and start);
each run publishes message IDs of its own. Needs root. Under failure the lab is taken down and
the exception says which block or wait failed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from twinflow_dev.guide_hosts import PEER_HOSTS
from twinflow_dev.guide_lab import GuideLab, build_wheel
from twinflow_dev.lab import LabError

from ..testing.checker import check, check_outputs, wait_judged
from ..testing.messages import order_or_payment
from ..runtime.waiting import wait_for
from .guide_zookeeper import (TOPOLOGY, add_setup, install_spare, remove_setup, topology_zookeeper,
                              topology_zookeeper_add, topology_zookeeper_remove)
from .host_drills import HostDrill, HostDrillRunner, HostDrillSpec, this_run, timeout_errors

ROLE_DEADLINE_S = 60.0  # a Redis primary's machine lost: Sentinel's failover, then the election
NEW_TIMEOUT_S = 15      # flow-change: the join's time-out after the change (10 s before)
MORE = 400              # messages published after a change, judged by the drill itself


def _host_of(peer: str) -> str:
    return PEER_HOSTS[peer]


def guide(d: HostDrill) -> None:
    lab: GuideLab = d.lab
    d.wait_sent(0.4)
    host = _host_of(d.master)
    d.fault(f"{host}.example died: {d.master}, a Redis, a Sentinel and a ZooKeeper server")
    lab.kill_host(host)
    d.wait_role(d.worker, "master", ROLE_DEADLINE_S)
    d.say(f"  {d.worker} is master")
    d.wait_sent(0.8)
    lab.come_back(host)
    d.wait_role(d.master, "worker", ROLE_DEADLINE_S)
    d.say(f"  {host}.example is back: its servers, and {d.master} as worker")


def rolling_upgrade_setup(d: HostDrill) -> None:
    """A wheel of the next version in the blocks' directory, beside the one installed (the
    guide's upgrade names the newest)."""
    from twinflow import __version__

    lab: GuideLab = d.lab
    version = f"{__version__}.post{d.seed}"
    build_wheel(lab.dist, version)
    if len(list(lab.dist.glob("twinflow-*.whl"))) < 2:
        raise LabError("the old wheel is not beside the new one: the drill would not show pip choosing")
    d.figures["version"] = version


def rolling_upgrade(d: HostDrill) -> None:
    from twinflow import __version__

    lab: GuideLab = d.lab
    d.wait_sent(0.1)
    upgrade = lab.blocks_of("Upgrading twinflow", "")
    lab.run_block(upgrade[0], say=d.say)  # the backup, on host-a
    for peer in (d.worker, d.master):  # the guide's upgrade, one machine at a time
        d.window(f"{peer} upgraded (the guide's block on {_host_of(peer)})")
        out = [o for b in upgrade[1:] for o in lab.run_block(b, hosts=[_host_of(peer)], say=d.say)]
        d.healed()
        d.say(f"  {peer}: {''.join(out).strip()}")
    versions = {p: r.get("version") for p, r in lab.peer_statuses().items()}
    d.figures["versions"] = versions
    if set(versions.values()) != {d.figures["version"]}:
        raise LabError(f"after the upgrade the peers report {versions}, not {d.figures['version']}")
    # Rolling back to the version before, by the backup taken before the upgrade, once every
    # message is out; then the producer sends everything again.
    d.wait_sent(1.0)
    if not wait_for(lambda: check_outputs(lab.outputs(), _acked(d)).delivered >= d.sent(), 120, 0.5):
        raise LabError("not every message out of the flow before the rollback")
    d.fault("rolled back: both peers stopped, the old wheel, the backup before the upgrade restored", lasts=True)
    lab.run_blocks("Upgrading twinflow", "Rolling back", say=d.say)
    d.healed()
    versions = {p: r.get("version") for p, r in lab.peer_statuses().items()}
    d.figures["versions_after_rollback"] = versions
    if set(versions.values()) != {__version__}:
        raise LabError(f"after the rollback the peers report {versions}, not {__version__}")
    _resend(d, "after the rollback")


def flow_change(d: HostDrill) -> None:
    lab: GuideLab = d.lab
    old = lab.plan.flow_path.read_text()
    new = old.replace("timeout: 10 ", f"timeout: {NEW_TIMEOUT_S} ", 1)
    if new == old:
        raise LabError("the lab's flow file has no join time-out of 10 s to change")
    peer = d.worker
    host = lab.host(_host_of(peer))
    installed = host.path("/etc/twinflow/flow.yaml")
    # First a file validate refuses (the mistake of a second `cluster:` key): the guide's block
    # stops at validate, the live file stays, and nothing restarts.
    (lab.dist / "flow-new.yaml").write_text(old + "cluster: {wait_replicas: 1}\n")
    d.wait_sent(0.1)
    before = lab.process(host.name, f"twinflow-peer@{peer}")
    try:
        lab.run_blocks("Changing a running flow", hosts=[host.name], say=d.say)
    except LabError as exc:
        refused = next((line for line in str(exc).splitlines() if "appears twice" in line), None)
    else:
        raise LabError("the guide's block went on past a flow file validate refuses")
    now = lab.process(host.name, f"twinflow-peer@{peer}")
    d.figures["validate_refused"] = refused
    if refused is None or installed.read_text() != old or now.pid != before.pid or not lab.alive(now):
        raise LabError(f"a refused flow file: refusal {refused!r}, live file unchanged "
                       f"{installed.read_text() == old}, {peer} not restarted {now.pid == before.pid}")
    d.say(f"  a second cluster: key refused by validate ({refused.strip()}); nothing copied, nothing restarted")
    (lab.dist / "flow-new.yaml").write_text(new)
    # Then, while orders wait in the join: a flow file without it, refused whole at start.
    d.wait_sent(0.2)
    installed.write_text(_without_join(old))
    d.window(f"{peer} restarted on a flow file without the join")
    lab.systemctl(host.name, ["restart", f"twinflow-peer@{peer}"])
    p = lab.process(host.name, f"twinflow-peer@{peer}")
    status = lab.wait_exit(p, 120)
    log = Path(p.log).read_text(errors="replace")
    refusal = next((line for line in log.splitlines() if "drops node 'match'" in line), None)
    d.figures["refused"] = {"exit": status, "message": refusal}
    if status != 4 or refusal is None:
        raise LabError(f"{peer} on a flow file without the join: exit {status}, not 4 with the reason:\n{log[-3000:]}")
    if lab.master() != d.master:
        raise LabError(f"{d.master} is not master any more after {peer}'s refusal")
    installed.write_text(old)  # the operator puts the old file back
    lab.start_peer(peer)
    lab.wait_streaming(peer)
    d.healed()
    d.say(f"  {peer} refused the flow file without the join (exit 4) and is back on the old one")
    # Then the change that takes effect: the guide's block on each machine in turn, and the
    # client host's copy.
    for peer in (d.worker, d.master):
        d.window(f"{peer} restarted on the changed flow file")
        lab.run_blocks("Changing a running flow", hosts=[_host_of(peer)], say=d.say)
        d.healed()
    lab.run_blocks("Changing a running flow", hosts=["host-c"], say=d.say)
    for name in ("host-a", "host-b", "host-c"):
        if lab.host(name).path("/etc/twinflow/flow.yaml").read_text() != new:
            raise LabError(f"{name}'s flow file is not the new one after the guide's change")
    changed_at = time.time()
    out = publish_more(d, MORE, "after_change")
    d.figures.update(timeout_errors(lab, out, changed_at, timeout_ms=NEW_TIMEOUT_S * 1000))
    early = d.figures.get("timeout_error_ms_min")
    if early is None or early < -1000:
        raise LabError(f"the lone orders sent after the change did not wait the new time-out: {d.figures}")


def publish_more(d: HostDrill, count: int, what: str) -> dict:
    """``count`` messages more from the client host (IDs after the run's own), judged here: each
    delivered once, or LabError; what left the flow of them."""
    lab: GuideLab = d.lab
    first = d.figures["first"] + d.total + d.figures.get("more", 0)
    d.figures["more"] = d.figures.get("more", 0) + count  # the runner's next run starts after them
    ids = {order_or_payment(i)["id"] for i in range(first, first + count)}
    acked = lab.directory / f"acked-more-{first}.txt"
    acked.unlink(missing_ok=True)
    publisher = lab.publisher(count, d.rate, acked, first)
    if lab.wait_exit(publisher, count / d.rate + 120) != 0:
        raise LabError(f"publishing {what} failed:\n" + lab.logs([publisher], 20))
    sent = acked.read_text().split()
    out = wait_judged(lambda: this_run(lab.outputs(), ids), sent, 120)
    report = check(out, sent)
    d.figures[what] = {"sent": len(sent), "lost": report.lost, "duplicated": report.duplicated}
    if (len(sent), report.lost, report.duplicated) != (count, 0, 0):
        raise LabError(f"{what}: {d.figures[what]}")
    return out


def _without_join(text: str) -> str:
    """The flow file with the join ``match`` taken out (its input linked to delivery)."""
    import yaml

    doc = yaml.safe_load(text)
    del doc["nodes"]["match"]
    doc["nodes"]["guard"]["links"]["new"] = "deliver"
    return yaml.safe_dump(doc, sort_keys=False)


def rotation(d: HostDrill) -> None:
    lab: GuideLab = d.lab
    d.wait_sent(0.1)
    lab.run_blocks("Rotating certificates and tokens", "Tokens", say=d.say)
    d.say("  the old tokens are refused, the new ones taken")
    lab.run_blocks("Rotating certificates and tokens", "A new CA and its certificates", say=d.say)
    d.say("  a certificate of the old CA is refused, the new CA's taken")
    out = lab.run_blocks("Rotating certificates and tokens", "New certificates from the same CA", say=d.say)
    d.figures["renewed_until"] = [line for line in "".join(out).splitlines() if line.startswith("notAfter=")]
    d.say(f"  new certificates from the same CA, the peers' ending {d.figures['renewed_until']}")
    # The clients send with the new token, certificate and CA now (the guide's client steps).
    publish_more(d, MORE, "after_rotation")


def backup_restore(d: HostDrill) -> None:
    lab: GuideLab = d.lab
    d.wait_sent(0.5)
    lab.run_blocks("Backing up and restoring a flow", "Taking a backup", say=d.say)
    d.say("  backup taken")
    d.wait_sent(1.0)
    sent = d.sent()
    if not wait_for(lambda: check_outputs(lab.outputs(), _acked(d)).delivered >= sent, 120, 0.5):
        raise LabError("not every message out of the flow before the restore")
    before = lab.outputs()
    d.figures["delivered_before_restore"] = sum(len(v) for v in before.values())
    for block in lab.blocks_of("Backing up and restoring a flow", "Restoring"):
        if "twinflow restore" in block.text:  # the flow's keys lost while the peers are stopped
            lost = lab.forget_flow()
            d.fault(f"the flow's {lost} keys deleted from Redis, the peers stopped", lasts=True)
        lab.run_block(block, say=d.say)
    d.healed()
    _resend(d, "after the restore")


def _resend(d: HostDrill, what: str) -> None:
    """The producer sends everything again: the restored ID cache takes each message once."""
    lab: GuideLab = d.lab
    again = lab.directory / f"resent-{d.seed}-{int(time.time())}.txt"
    again.unlink(missing_ok=True)
    publisher = lab.publisher(d.total, d.rate, again, d.figures["first"])
    if lab.wait_exit(publisher, d.total / d.rate + 180) != 0:
        raise LabError(f"the resend {what} failed:\n" + lab.logs([publisher], 20))
    d.say(f"  resent {len(again.read_text().split())} messages {what}")


def _acked(d: HostDrill) -> list[str]:
    return (d.lab.directory / f"acked-{d.figures['first']}.txt").read_text().split()


def topology_peer(d: HostDrill) -> None:
    lab: GuideLab = d.lab
    d.wait_sent(0.1)
    d.window("peer-c added on host-d.example (the guide's blocks)")
    lab.run_blocks(TOPOLOGY, "Adding a peer", say=d.say)
    d.healed()
    streaming = sorted(p for p, r in lab.peer_statuses().items() if r.get("streaming") == "1")
    if streaming != ["peer-a", "peer-b", "peer-c"]:
        raise LabError(f"after adding peer-c, streaming: {streaming}")
    if not wait_for(lambda: _scraped(lab, 3), 90, 1.0):
        raise LabError(f"Prometheus does not scrape three peers: {lab.prometheus_targets()}")
    d.figures["topology"] = {"peers_added": streaming, "scraped_added": sorted(lab.prometheus_targets())}
    d.say(f"  three peers stream ({', '.join(streaming)}), Prometheus scrapes three")
    d.wait_sent(0.6)
    d.window("peer-c removed (the guide's blocks)")
    lab.run_blocks(TOPOLOGY, "Removing a peer", say=d.say)
    d.healed()
    if not wait_for(lambda: _scraped(lab, 2), 90, 1.0):
        raise LabError(f"Prometheus still scrapes peer-c: {lab.prometheus_targets()}")
    d.figures["topology"]["peers_removed"] = sorted(lab.peer_ids())
    d.say("  peer-c removed; two peers, two targets")


def _scraped(lab: GuideLab, count: int) -> bool:
    targets = lab.prometheus_targets()
    return len(targets) == count and all(h == "up" for h in targets.values())


def topology_redis(d: HostDrill) -> None:
    lab: GuideLab = d.lab
    d.wait_sent(0.1)
    d.window("a Redis replica added on host-d.example (the guide's blocks)")
    lab.run_blocks(TOPOLOGY, "Adding a Redis server", say=d.say)
    d.healed()
    d.figures["topology"] = {"replicas_added": _replicas(lab)}
    d.say(f"  the primary has {d.figures['topology']['replicas_added']} replicas")
    d.wait_sent(0.5)
    d.window("the replica on host-d.example removed (the guide's blocks)")
    lab.run_blocks(TOPOLOGY, "Removing a Redis server", say=d.say)
    d.healed()
    d.figures["topology"]["replicas_removed"] = _replicas(lab)
    if (d.figures["topology"]["replicas_added"], d.figures["topology"]["replicas_removed"]) != (3, 2):
        raise LabError(f"the primary's replicas: {d.figures['topology']}")


def _replicas(lab: GuideLab) -> int:
    client = lab.redis()
    try:
        return int(client.info("replication").get("connected_slaves", 0))
    finally:
        client.close()


GUIDE_DRILLS: dict[str, HostDrillSpec] = {
    "guide": HostDrillSpec(guide, rate=200.0, kills_master=False),
    "rolling-upgrade": HostDrillSpec(rolling_upgrade, rate=100.0, kills_master=False, setup=rolling_upgrade_setup),
    "flow-change": HostDrillSpec(flow_change, rate=100.0, kills_master=False),
    "rotation": HostDrillSpec(rotation, rate=100.0, kills_master=False),
    "backup-restore": HostDrillSpec(backup_restore, rate=200.0, kills_master=False),
    # Slow traffic, so that it runs through each change (a peer's start, rolling restarts).
    "topology-peer": HostDrillSpec(topology_peer, rate=10.0, kills_master=False, setup=install_spare),
    # Growing and shrinking the ensemble before moving server 3: they need the guide's first three.
    "topology-zookeeper-add": HostDrillSpec(topology_zookeeper_add, rate=10.0, kills_master=False, setup=add_setup),
    "topology-zookeeper-remove": HostDrillSpec(topology_zookeeper_remove, rate=10.0, kills_master=False,
                                               setup=remove_setup),
    "topology-zookeeper": HostDrillSpec(topology_zookeeper, rate=10.0, kills_master=False, setup=install_spare),
    "topology-redis": HostDrillSpec(topology_redis, rate=10.0, kills_master=False, setup=install_spare),
}


class GuideDrillRunner(HostDrillRunner):
    """The guide's drills on one guide lab for the whole series (see module)."""

    drills = GUIDE_DRILLS

    def __init__(self, messages: int = 3000, rate: float | None = None,
                 directory: str | Path = "/var/tmp/twinflow-guide-lab", prefix: str = "tfguide-",
                 settle_s: float = 120.0, say: Callable[[str], None] = lambda text: None):
        super().__init__(messages, rate, directory, prefix, settle_s, say)

    def _lab_for(self, name: str) -> GuideLab:
        if self.lab is None:
            lab = GuideLab(self.directory, prefix=self.prefix)
            lab.up(self.say)
            self.lab = lab
        self.drill = name
        return self.lab

    def _run(self, lab: GuideLab, name: str, seed: int) -> dict:
        """A drill's run, then what root reads or runs checked on every host: a file the service
        user could change fails the run."""
        result = super()._run(lab, name, seed)
        problems = lab.ownership_problems()
        result["owned_by_root"] = not problems
        if problems:
            result["passed"] = False
            result["error"] = "files root reads or runs that the service user could change: " + "; ".join(problems)
        return result
