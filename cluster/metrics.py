"""A peer's Prometheus metrics, served over HTTP (``twinflow run --metrics-listen HOST:PORT``).

Everything is read at scrape time from what the peer keeps anyway: its
``status()``, its plain-int counters, its escalation sender's ``stats()``,
its leadership's and its store's connection counters; and the ends of its TLS
certificates, read once at its start (twinflow/tls_expiry.py), less the
scrape's time. Nothing is called per message: the master's batch loop runs
~16k messages a second and a Prometheus counter increment per message would
cost real throughput. Durations (a
batch, a timer's lateness) go into a :class:`~twinflow.cluster.timings.Timings`, observed once per
batch or per firing round.

Each peer has a registry of its own (not prometheus-client's global
one), so that several peers can run in one process (the tests do). A
sharded peer serves one endpoint for all its shards: each shard's metrics
carry the shard's flow name in ``flow``. docs/reference/metrics.md lists every
metric.

The endpoint is plain, unauthenticated HTTP: metrics carry no secrets, but
bind it to loopback or a monitoring network.

Under failure: a scrape never waits long for Redis. The only Redis calls are
the uplink lag's two (one attempt each, bounded by the socket time-out; the
lag in seconds comes from the same replies); when they fail both lags are left
out of that scrape and ``twinflow_redis_up`` says why. A metric that cannot be
read is left out; the scrape still answers.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from .timings import BatchTimings

if TYPE_CHECKING:
    from twinflow.tls_expiry import Expiry

    from .member import FlowMember

log = logging.getLogger("twinflow.metrics")

# Outcomes of twinflow_messages_total, each a counter the member keeps (its status or state's counts).
OUTCOMES = ("delivered", "skipped", "failed", "claimed", "unclaimed", "rolled_back", "claims_unproven", "nohit")
ROLES = ("master", "worker", "starting")


def outlink_names(member: "FlowMember") -> dict[str, str]:
    """The Redis stream of each of the flow's unlinked outlinks -> ``<flow node>.<outlink>`` (names
    joined with ``,`` when outlinks share a stream, e.g. two actions with one sink)."""
    from .master_flow import outlink_streams

    names: dict[str, list[str]] = {}
    for (name, outlink), stream in outlink_streams(member.graph, member.keys).items():
        names.setdefault(stream, []).append(f"{name}.{outlink}")
    return {stream: ",".join(v) for stream, v in names.items()}


class PeerCollector(Collector):
    """Reads ``members`` (a peer's members: one, or one per shard) at each scrape.

    ``server``: the gRPC server whose token refusals to report (one per process);
    ``frames``: a sharded peer's (flow name, BatchTimings) of its micro-batches.
    """

    def __init__(self, members: Callable[[], list["FlowMember"]], server: Callable[[], Any] | None = None,
                 frames: tuple[str, BatchTimings] | None = None, certificates: Sequence["Expiry"] = (),
                 now: Callable[[], float] = time.time):
        self.members, self.server, self.frames = members, server, frames
        self.certificates, self.now = tuple(certificates), now
        self._outlinks: dict[str, dict[str, str]] = {}  # flow -> stream -> outlink name

    def collect(self):
        members = self.members()
        # "node" repeats "peer": dashboards and alerts that select on "node" keep working.
        base = ["flow", "peer", "node"]
        f: dict[str, Any] = {}

        def family(kind, name, doc, labels=()):
            if name not in f:
                f[name] = kind(name, doc, labels=base + list(labels))
            return f[name]

        for n in members:
            try:
                self._collect_node(n, family)
            except Exception:  # one member's bad read must not fail the whole scrape
                log.exception("metrics of %s %s could not be read", n.name, n.cfg.peer_id)
        if self.frames is not None and members:
            flow, timings = self.frames
            hist = family(HistogramMetricFamily, "twinflow_batch_duration_seconds",
                          "Time to process one uplink batch, once per batch", ["role"])
            for role, t in sorted(timings.by_role.items()):
                buckets, total = t.snapshot()
                hist.add_metric([flow, members[0].cfg.peer_id, members[0].cfg.peer_id, role], buckets, total)
        if members:
            # What the process as a whole has (one gRPC server, one certificate): under the peer's
            # flow name, a sharded flow's own, not a shard's.
            who = [self.frames[0] if self.frames else members[0].name, members[0].cfg.peer_id,
                   members[0].cfg.peer_id]
            self._collect_server(who, family)
            self._collect_certificates(who, family)
        yield from f.values()

    def _collect_server(self, who: list[str], family) -> None:
        check = getattr(self.server(), "token_check", None) if self.server is not None else None
        if check is None:
            return
        refused = family(CounterMetricFamily, "twinflow_grpc_refused",
                         "gRPC calls refused by the token check", ["reason"])
        for reason, count in sorted(dict(check.refused).items()):
            refused.add_metric(who + [reason], count)
        not_first = family(CounterMetricFamily, "twinflow_grpc_accepted_not_first",
                           "gRPC calls accepted with a token other than the first of its scope's "
                           "list (a caller still sending a token being rotated out)", ["scope"])
        for scope, count in sorted(dict(check.accepted_not_first).items()):
            not_first.add_metric(who + [scope], count)

    def _collect_certificates(self, who: list[str], family) -> None:
        if not self.certificates:
            return
        gauge = family(GaugeMetricFamily, "twinflow_tls_expires_in_seconds",
                       "Seconds until the peer's own TLS certificate (certificate=\"peer\") and the CA's "
                       "that signed it (certificate=\"ca\") expire, as the peer loaded them at its start; "
                       "negative once expired", ["certificate", "subject"])
        now = self.now()
        for cert in self.certificates:
            gauge.add_metric(who + [cert.certificate, cert.subject], round(cert.seconds_left(now), 3))

    def _collect_node(self, n: "FlowMember", family) -> None:
        s = n.status()
        tally = n.state.counts()
        who = [n.name, n.cfg.peer_id, n.cfg.peer_id]
        family(CounterMetricFamily, "twinflow_uplink_read", "Uplink entries this peer read (messages in)"
               ).add_metric(who, tally["read"])
        out = family(CounterMetricFamily, "twinflow_messages",
                     "Messages by what became of them on this peer", ["outcome"])
        counts = {**s, "skipped": tally["skipped"]}
        for outcome in OUTCOMES:
            out.add_metric(who + [outcome], int(counts.get(outcome) or 0))
        if n.name not in self._outlinks:
            self._outlinks[n.name] = outlink_names(n)
        names = self._outlinks[n.name]
        left = dict(n.master.left)  # one C-level copy: the batch thread may add to it meanwhile
        per_outlink = family(CounterMetricFamily, "twinflow_outlink_messages",
                             "Messages that left the flow through each outlink in this peer's committed "
                             "master steps", ["outlink"])
        for stream, name in sorted(names.items(), key=lambda kv: kv[1]):
            per_outlink.add_metric(who + [name], left.get(stream, 0))
        hist = family(HistogramMetricFamily, "twinflow_batch_duration_seconds",
                      "Time to process one uplink batch, once per batch", ["role"])
        for role, t in sorted(n.intake.batch_timings.by_role.items()):
            buckets, total = t.snapshot()
            hist.add_metric(who + [role], buckets, total)
        buckets, total = n.master.lateness.snapshot()
        family(HistogramMetricFamily, "twinflow_timer_lateness_seconds",
               "How late the master fired the flow's due deadlines, once per firing round"
               ).add_metric(who, buckets, total)
        if int(s.get("uplink_lag", -1)) >= 0:  # -1: Redis did not answer this time
            family(GaugeMetricFamily, "twinflow_uplink_lag", "Uplink entries this peer has not read yet"
                   ).add_metric(who, s["uplink_lag"])
            family(GaugeMetricFamily, "twinflow_uplink_lag_seconds", "The newest uplink entry's time minus "
                   "that of the last one this peer read (0: read up)").add_metric(who, float(s.get("uplink_lag_s", 0)))
        for name, key, doc in (
            ("twinflow_baked", "baked", "Messages the worker's claim sort withholds now"),
            ("twinflow_pending", "pending", "Node state the master's flow holds now (open groups, timers)"),
            ("twinflow_backpressure", "backpressure", "1 while a worker has stopped reading (max_pending)"),
            ("twinflow_holding", "holding", "1 while a master holds a batch (ZooKeeper suspended)"),
            ("twinflow_streaming", "streaming", "1 once the peer's stream ran its warm-up batch"),
            ("twinflow_epoch", "epoch", "The master's epoch (a worker: the newest it has seen)"),
        ):
            family(GaugeMetricFamily, name, doc).add_metric(who, int(s.get(key) or 0))
        suspended = family(GaugeMetricFamily, "twinflow_suspended",
                           "1 while an action node suspended the flow (retries used up, on_retry_failure: "
                           "suspend): every peer stops reading until it resumes", ["node", "reason"])
        for node, held in sorted((s.get("suspended") or {}).items()):
            suspended.add_metric(who + [node, str(held.get("reason", ""))[:200]], 1)
        rule_pending = s.get("rule_pending") or {}
        if rule_pending:
            gauge = family(GaugeMetricFamily, "twinflow_rule_pending",
                           "RULE_PEND: messages the worker's claim sort withholds now, per ruleset", ["ruleset"])
            for ruleset, count in sorted(rule_pending.items()):
                gauge.add_metric(who + [ruleset], int(count))
        if s.get("clock_offset_s") is not None:  # known once the flow's clock sampled Redis's time
            family(GaugeMetricFamily, "twinflow_clock_offset_seconds",
                   "This machine's wall clock minus the Redis server's time, as the flow's clock last "
                   "sampled it (the flow's time follows Redis's)").add_metric(who, float(s["clock_offset_s"]))
        role = s.get("role", "starting")
        family(GaugeMetricFamily, "twinflow_is_master", "1 while this peer is the flow's master"
               ).add_metric(who, int(role == "master"))
        roles = family(GaugeMetricFamily, "twinflow_role", "1 for the role this peer has now", ["role"])
        for r in ROLES:
            roles.add_metric(who + [r], int(role == r))
        family(CounterMetricFamily, "twinflow_fenced", "Writes of this peer as master refused by the "
               "fence (a newer master exists): it stepped down each time").add_metric(who, tally["fenced"])
        received = family(CounterMetricFamily, "twinflow_escalation_batches_received",
                          "Escalation batches that reached this peer", ["result"])
        received.add_metric(who + ["accepted"], tally["escalations_taken"])
        received.add_metric(who + ["refused"], int(s.get("escalations_refused") or 0))
        self._collect_sender(n, who, family)
        store = n.store
        if store is not None:
            family(GaugeMetricFamily, "twinflow_redis_up", "1 while the peer's calls to Redis get answers"
                   ).add_metric(who, int(store.failing_since is None))
            family(CounterMetricFamily, "twinflow_redis_outages", "Times Redis stopped answering this peer "
                   "(each ends in a reconnect)").add_metric(who, getattr(store, "outages", 0))
        audit = n.audit.counts()  # as the master's last trim round read them (audit_upkeep.py)
        if audit is not None:
            family(CounterMetricFamily, "twinflow_audit_removed_unhandled", "Audit entries the retention "
                   "removed while still FAILED (never resubmitted nor discarded): the flow's count in Redis, "
                   "as this peer's last trim as master read it").add_metric(who, audit["removed_unhandled"])
            family(GaugeMetricFamily, "twinflow_audit_failed", "Audit entries FAILED now (neither resubmitted "
                   "nor discarded), as this peer's last trim as master read it").add_metric(who, audit["failed"])
            family(CounterMetricFamily, "twinflow_notices_removed", "Error notices the notice stream's cap "
                   "removed: the flow's count in Redis").add_metric(who, audit["notices_removed"])
        trims = n.streams.counts()  # as the master's last trim round read them (stream_upkeep.py)
        if trims is not None:
            removed = family(CounterMetricFamily, "twinflow_stream_trimmed", "Entries the retention removed from "
                             "each stream the flow writes: the flow's count in Redis, as this peer's last trim as "
                             "master read it", ["stream"])
            unread = family(CounterMetricFamily, "twinflow_stream_trimmed_unread", "Of those, the entries no "
                            "consumer group of the stream had read yet: the flow's count in Redis, as this "
                            "peer's last trim as master read it", ["stream"])
            for stream, (count, not_read) in sorted(trims.items()):
                removed.add_metric(who + [stream], count)
                unread.add_metric(who + [stream], not_read)
        lead = n.leadership
        if lead is not None:
            family(GaugeMetricFamily, "twinflow_zookeeper_connected", "1 while the ZooKeeper connection is up"
                   ).add_metric(who, int(not lead.suspended))
            family(CounterMetricFamily, "twinflow_zookeeper_disconnects", "Times the ZooKeeper connection "
                   "dropped (SUSPENDED)").add_metric(who, getattr(lead, "disconnects", 0))
            family(CounterMetricFamily, "twinflow_zookeeper_sessions_lost", "Times the ZooKeeper session "
                   "expired (LOST)").add_metric(who, getattr(lead, "sessions_lost", 0))

    @staticmethod
    def _collect_sender(n: "FlowMember", who: list[str], family) -> None:
        stats = getattr(n.sender, "stats", None)
        if stats is None:
            return
        targets = stats()["targets"]
        batches = family(CounterMetricFamily, "twinflow_escalation_batches",
                         "Escalation batches this peer sent as master, per target", ["target", "result"])
        claims = family(CounterMetricFamily, "twinflow_escalation_claims",
                        "Escalation claims this peer sent as master, per target", ["target", "result"])
        pending = family(GaugeMetricFamily, "twinflow_escalation_pending_claims",
                         "Claims buffered or awaiting an ack, per target", ["target"])
        for target, t in sorted(targets.items()):
            for result in ("sent", "acked", "refused"):
                batches.add_metric(who + [target, result], t.get(f"batches_{result}", 0))
            for result in ("enqueued", "sent", "resent", "acked", "refused", "dropped"):
                claims.add_metric(who + [target, result], t[result])
            pending.add_metric(who + [target], t["pending"])


class MetricsServer:
    """The HTTP endpoint of one peer; ``address`` is where it listens (port 0 resolved)."""

    def __init__(self, listen: str, collector: PeerCollector):
        host, port = split_address(listen)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._httpd, self._thread = start_http_server(port, host, registry=self.registry)
        bound = self._httpd.server_address
        self.address = f"{'[' + host + ']' if ':' in host else host}:{bound[1]}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)


def split_address(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) -> (host, port).

    >>> split_address("127.0.0.1:9464"), split_address("[::1]:0")
    (('127.0.0.1', 9464), ('::1', 0))
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {listen!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(listen: str, members: Callable[[], list["FlowMember"]], *, server: Callable[[], Any] | None = None,
          frames: tuple[str, BatchTimings] | None = None, certificates: Sequence["Expiry"] = ()) -> MetricsServer:
    """Serve the metrics of ``members`` on ``listen``; the caller stops the result."""
    return MetricsServer(listen, PeerCollector(members, server=server, frames=frames, certificates=certificates))

