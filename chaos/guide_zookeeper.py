"""The deployment guide's ZooKeeper ensemble changes as drills between hosts (part of
:mod:`.guide_drills`), each the guide's "Changing the machines" blocks run as written under
traffic from host-c, judged by the one checker as the other guide drills are; and the spare
machine, ``host-d.example``, that every topology drill installs first.

- ``topology-zookeeper``: "Replacing a ZooKeeper server": server 3 moved from host-c to host-d
  (the old one stopped, the new one joined, the others' lists and the peers' each changed with a
  rolling restart); three servers leading or following, none on host-c.
- ``topology-zookeeper-add``: "Adding a ZooKeeper server": a fourth server started on host-d,
  then each of the three others restarted with the four-server list, one at a time, the leader
  last (the order the guide gives), then the peers' ``TWINFLOW_ZK`` with a rolling restart; four
  servers, one leader with three followers in step, each counting four voters.
- ``topology-zookeeper-remove``: "Removing a ZooKeeper server": the peers' list first, the
  fourth server moved off the leader's role, the three others restarted with the three-server
  list, the leader last, then the fourth stopped for good; three servers counting three voters,
  none on host-d. Before the traffic, the fourth server is added as above when the lab has only
  the guide's three (the drill then runs alone).

The growing and shrinking drills need the guide's first ensemble (servers on host-a, host-b and
host-c): after ``topology-zookeeper`` moved server 3 to host-d, they refuse with
:class:`~twinflow_dev.lab.LabError` before the traffic. Under failure a block's exit or a
wait past its deadline raises LabError naming it, and the drill's lab is taken down.
"""

from __future__ import annotations

import time

from twinflow_dev.guide_blocks import GuideBlock
from twinflow_dev.guide_hosts import PEER_HOSTS
from twinflow_dev.guide_lab import GuideLab
from twinflow_dev.lab import LabError

from .host_drills import HostDrill

TOPOLOGY = "Changing the machines"
ADD, REMOVE = "Adding a ZooKeeper server", "Removing a ZooKeeper server"
FIRST_SERVERS = ("host-a", "host-b", "host-c")
UNIT = "twinflow-zookeeper"


def install_spare(d: HostDrill) -> None:
    """The spare machine, host-d.example, installed as the guide says (once per lab)."""
    lab: GuideLab = d.lab
    if not lab.state.info.get("spare_installed"):
        lab.run_blocks(TOPOLOGY, "", say=d.say)
        lab.state.info["spare_installed"] = True
        lab.save()


def topology_zookeeper(d: HostDrill) -> None:
    lab: GuideLab = d.lab
    d.wait_sent(0.05)
    d.window("ZooKeeper server 3 moved from host-c.example to host-d.example (the guide's blocks)")
    lab.run_blocks(TOPOLOGY, "Replacing a ZooKeeper server", say=d.say)
    d.healed()
    modes = zk_modes(lab, ("host-a", "host-b", "host-d"))
    d.figures["topology"] = {"zookeeper_replaced": modes}
    if sorted(str(m) for m in modes.values()) != ["follower", "follower", "leader"]:
        raise LabError(f"after moving server 3 the ensemble is {modes}")
    if lab.zk_mode_of("host-c") is not None:
        raise LabError("the old server on host-c still answers")
    d.say(f"  server 3 on host-d: {modes}")


def zk_modes(lab: GuideLab, hosts: tuple[str, ...]) -> dict[str, str | None]:
    """Each host's ZooKeeper server's mode as ``srvr`` tells it from host-c (None: no answer)."""
    return {h: lab.zk_mode_of(h) for h in hosts}


def _servers(lab: GuideLab) -> tuple[str, ...]:
    """The hosts whose ZooKeeper unit is enabled, in the guide's order."""
    return tuple(sorted(lab.hosts_running(UNIT)))


def _first_ensemble(d: HostDrill) -> None:
    """The spare installed, and the guide's first three servers (or LabError)."""
    install_spare(d)
    servers = _servers(d.lab)
    if servers[:3] != FIRST_SERVERS:
        raise LabError(f"the ensemble runs on {servers}, not the guide's first three {FIRST_SERVERS}: "
                       f"growing or shrinking it needs a lab where server 3 was not moved")


def add_setup(d: HostDrill) -> None:
    _first_ensemble(d)
    if _servers(d.lab) != FIRST_SERVERS:
        raise LabError(f"the ensemble already runs on {_servers(d.lab)}: nothing to add")


def remove_setup(d: HostDrill) -> None:
    """A fourth server to remove: added as the guide says (before the traffic) when there is none."""
    _first_ensemble(d)
    if _servers(d.lab) == FIRST_SERVERS:
        d.say("  a fourth ZooKeeper server first, before the traffic (the guide's blocks)")
        _run_section(d, ADD)
    if _servers(d.lab) != (*FIRST_SERVERS, "host-d"):
        raise LabError(f"the ensemble runs on {_servers(d.lab)}, not four servers with host-d's")


def _run_section(d: HostDrill, subsection: str) -> None:
    """The subsection's blocks in the guide's order; a ZooKeeper servers' rolling restart host by
    host with the leader last (as the guide says: its ``srvr`` asked just before)."""
    lab: GuideLab = d.lab
    for block in lab.blocks_of(TOPOLOGY, subsection):
        if _is_servers_rolling(block):
            for host in leader_last(block.hosts, zk_modes(lab, tuple(block.hosts))):
                lab.run_block(block, hosts=[host], say=d.say)
        else:
            lab.run_block(block, say=d.say)


def _is_servers_rolling(block: GuideBlock) -> bool:
    return "one-at-a-time" in block.flags and "as-peer" not in block.flags and UNIT in block.text


def leader_last(hosts: list[str], modes: dict[str, str | None]) -> list[str]:
    """``hosts`` in the guide's order, the one whose server leads moved to the end.

    >>> leader_last(["host-a", "host-b", "host-c"], {"host-a": "leader", "host-b": "follower"})
    ['host-b', 'host-c', 'host-a']
    """
    return sorted(hosts, key=lambda h: modes.get(h) == "leader")


def _mntr(lab: GuideLab, host: str) -> dict[str, str]:
    """``mntr``'s figures of ``host``'s server, asked from host-c ({} when it does not answer)."""
    try:
        reply = lab.zk_word(lab.state.host(host).address, "mntr")
    except OSError:
        return {}
    return dict(line.split("\t", 1) for line in reply.splitlines() if "\t" in line)


def _ensemble(lab: GuideLab, hosts: tuple[str, ...]) -> dict[str, dict]:
    """Each host's server: its mode, the voters it counts, and (the leader) its synced followers."""
    out = {}
    for h in hosts:
        figures = _mntr(lab, h)
        out[h] = {"mode": (figures.get("zk_server_state") or None),
                  "voters": int(figures["zk_quorum_size"]) if "zk_quorum_size" in figures else None}
        if "zk_synced_followers" in figures:
            out[h]["synced_followers"] = int(figures["zk_synced_followers"])
    return out


def _check(lab: GuideLab, hosts: tuple[str, ...], gone: tuple[str, ...]) -> dict[str, dict]:
    """The ensemble on ``hosts``: one leader, the others following, each counting them all, the
    leader's followers all in step; none answering on ``gone``; or LabError."""
    seen = _ensemble(lab, hosts)
    modes = sorted(str(s["mode"]) for s in seen.values())
    leader = next((s for s in seen.values() if s["mode"] == "leader"), {})
    if (modes != ["follower"] * (len(hosts) - 1) + ["leader"]
            or any(s["voters"] != len(hosts) for s in seen.values())
            or leader.get("synced_followers") != len(hosts) - 1):
        raise LabError(f"the ensemble on {hosts}: {seen}")
    answering = [h for h in gone if lab.zk_mode_of(h) is not None]
    if answering:
        raise LabError(f"a ZooKeeper server still answers on {answering}")
    return seen


def _peers_list(lab: GuideLab) -> dict[str, str]:
    """Each peer's ``TWINFLOW_ZK`` as its environment file on its machine says."""
    out = {}
    for peer in lab.peer_ids():
        env = lab.host(PEER_HOSTS[peer]).path(f"/etc/twinflow/{peer}.env").read_text()
        out[peer] = next((line.split("=", 1)[1] for line in env.splitlines() if line.startswith("TWINFLOW_ZK=")), "")
    return out


def topology_zookeeper_add(d: HostDrill) -> None:
    _change(d, ADD, (*FIRST_SERVERS, "host-d"), (), "added",
            "a fourth ZooKeeper server added on host-d.example (the guide's blocks)")


def topology_zookeeper_remove(d: HostDrill) -> None:
    _change(d, REMOVE, FIRST_SERVERS, ("host-d",), "removed",
            "the ZooKeeper server on host-d.example removed (the guide's blocks)")


def _change(d: HostDrill, section: str, servers: tuple[str, ...], gone: tuple[str, ...], done: str,
            window: str) -> None:
    """The guide's ``section`` run under traffic, then the ensemble checked on ``servers`` (none
    answering on ``gone``) and every peer's ``TWINFLOW_ZK`` naming host-d's server exactly when it
    is one of them; or LabError."""
    lab: GuideLab = d.lab
    d.wait_sent(0.1)
    d.window(window)
    t0 = time.monotonic()
    _run_section(d, section)
    d.healed()
    took = round(time.monotonic() - t0, 1)
    seen = _check(lab, servers, gone)
    lists = _peers_list(lab)
    adding = "host-d" in servers
    named = "host-d.example:2181" if adding else "host-d.example"
    if any((named in v) != adding for v in lists.values()):
        raise LabError(f"the peers' TWINFLOW_ZK after the server was {done}: {lists}")
    d.figures["topology"] = {f"zookeeper_{done}": seen, "peers_zk": lists, "change_s": took}
    d.say(f"  {len(servers)} servers in {took} s: {({h: s['mode'] for h, s in seen.items()})}")
