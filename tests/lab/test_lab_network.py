"""What ``twinflow lab down`` removes, given a state file: exactly what it lists and what of
that exists, processes first, and nothing of anyone else's (no root needed: the machine is a
fake that records what it is told to do)."""

from __future__ import annotations

import signal

from twinflow_dev.lab_network import HostOps, LabProcess, LabState, teardown


class FakeMachine(HostOps):
    """Namespaces, hub links, process groups and /etc/netns paths as a test says they are."""

    def __init__(self, namespaces, links, groups, paths, obeys_term):
        self.present = set(namespaces)
        self.hub_links = dict(links)
        self.groups = {k: list(v) for k, v in groups.items()}  # (pgid, ns) -> live pids
        self.paths = set(paths)
        self.obeys_term = set(obeys_term)
        self.calls: list[tuple] = []

    def group_in(self, pgid, ns):
        return list(self.groups.get((pgid, ns), []))

    def signal(self, pid, sig):
        self.calls.append(("signal", pid, sig))
        for key, pids in self.groups.items():
            if pid in pids and (sig == signal.SIGKILL or pid in self.obeys_term):
                self.groups[key] = [] if sig == signal.SIGTERM else [p for p in pids if p != pid]

    def signal_group(self, pgid, sig):
        self.calls.append(("group", pgid, sig))
        for key in self.groups:
            if key[0] == pgid:
                self.groups[key] = []

    def wait(self, condition, deadline_s):
        return bool(condition())  # no time passes here

    def namespaces(self):
        return set(self.present)

    def links(self, ns):
        return set(self.hub_links.get(ns, ()))

    def ip(self, *args):
        self.calls.append(("ip", *args))

    def exists(self, path):
        return path in self.paths

    def rmtree(self, path):
        self.calls.append(("rmtree", path))


def half_made_lab(tmp_path) -> LabState:
    """A lab whose `up` died before it made the client host: the hub, redis and peer-a were made,
    client not; the state file says so. Saved and loaded, as `down` reads it."""
    state = LabState(prefix="tflab-t-")
    for name, octet in (("redis", 10), ("peer-a", 31), ("client", 40)):
        state.add_host(name, octet)
    state.namespaces = ["tflab-t-hub", "tflab-t-redis", "tflab-t-peer-a"]
    state.netns_dirs = ["/etc/netns/tflab-t-redis", "/etc/netns/tflab-t-peer-a", "/etc/netns/tflab-t-client",
                        "/etc/hosts"]  # the last one tampered with: never removed
    state.processes = [LabProcess("redis", "redis", 101), LabProcess("redis", "old-redis", 303),
                       LabProcess("peer-a", "twinflow-run", 202), LabProcess("client", "publisher", 404)]
    state.save(tmp_path / "lab.json")
    return LabState.load(tmp_path / "lab.json")


def test_down_removes_what_the_state_lists_and_exists_processes_first(tmp_path):
    machine = FakeMachine(
        # tflab-t-client exists, but this lab did not make it (another `up` with the same prefix did)
        namespaces={"tflab-t-hub", "tflab-t-redis", "tflab-t-peer-a", "tflab-t-client", "tflab-t-stranger",
                    "tflab-other-redis"},
        links={"tflab-t-hub": {"lo", "br0", "v-redis", "v-peer-a", "v-stranger"}},
        # 202 (a peer) and 203 (its JVM) share a group; 303 is gone; 404 runs in tflab-t-client,
        # which this lab did not make: not its to signal.
        groups={(101, "tflab-t-redis"): [101], (202, "tflab-t-peer-a"): [202, 203], (404, "tflab-t-client"): [404]},
        paths={"/etc/netns/tflab-t-redis", "/etc/netns/tflab-t-peer-a", "/etc/netns/tflab-t-stranger", "/etc/hosts"},
        obeys_term={101},  # redis ends on SIGTERM; the peer does not, so its whole group is killed
    )
    report = teardown(half_made_lab(tmp_path), machine)

    assert machine.calls == [
        # the last started first: the peer ignores SIGTERM, so its group (peer and JVM) is killed
        ("signal", 202, signal.SIGTERM), ("group", 202, signal.SIGKILL),
        ("signal", 101, signal.SIGTERM),
        ("ip", "-n", "tflab-t-hub", "link", "del", "v-redis"),
        ("ip", "-n", "tflab-t-hub", "link", "del", "v-peer-a"),
        ("ip", "netns", "del", "tflab-t-peer-a"),
        ("ip", "netns", "del", "tflab-t-redis"),
        ("ip", "netns", "del", "tflab-t-hub"),
        ("rmtree", "/etc/netns/tflab-t-redis"),
        ("rmtree", "/etc/netns/tflab-t-peer-a"),
    ]
    assert "refused: /etc/hosts is not an /etc/netns directory of the lab" in report
    assert report[:3] == ["refused: process 404 (publisher) is on client, not in a namespace this lab made",
                          "killed twinflow-run (pid 202, its process group) on peer-a",
                          "stopped redis (pid 101) on redis"]


def test_down_of_a_lab_already_gone_does_nothing(tmp_path):
    machine = FakeMachine(namespaces={"tflab-other-hub"}, links={}, groups={}, paths=set(), obeys_term=())
    assert teardown(half_made_lab(tmp_path), machine) == [
        "refused: process 404 (publisher) is on client, not in a namespace this lab made",
        "refused: /etc/hosts is not an /etc/netns directory of the lab"]
    assert machine.calls == []


def test_a_listed_namespace_outside_the_prefix_is_refused(tmp_path):
    state = half_made_lab(tmp_path)
    state.hosts[0].ns = state.namespaces[1] = "production"  # a state file edited by hand
    machine = FakeMachine(namespaces={"production", "tflab-t-hub"}, links={}, groups={(101, "production"): [101]},
                          paths=set(), obeys_term={101})
    report = teardown(state, machine)
    assert ("ip", "netns", "del", "production") not in machine.calls
    assert not any(c[0] == "signal" for c in machine.calls)
    assert "refused: namespace production is outside the lab's prefix tflab-t-" in report
    assert machine.calls == [("ip", "netns", "del", "tflab-t-hub")]
