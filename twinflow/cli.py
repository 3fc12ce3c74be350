"""The ``twinflow`` command: run a peer, inspect a flow, manage local services, run the demo.

Addresses come from flags, else from the environment (TWINFLOW_REDIS,
TWINFLOW_ZK, TWINFLOW_SPARK_MASTER), else from the local services that
``twinflow services up`` recorded in .twinflow/services.json.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from twinflow import __version__
from twinflow.cli_backup import cmd_backup, cmd_restore
from twinflow.cli_console import cmd_console
from twinflow.cli_common import LAB_DIR, SERVICES_STATE, START_FROM, operator_security_flags
from twinflow.cli_failures import cmd_failures
from twinflow.cli_lab import cmd_lab
from twinflow.cli_peer import cmd_handover, cmd_run, cmd_status
from twinflow.cli_publish import cmd_publish
from twinflow.cli_resume import cmd_resume
from twinflow.cli_tools import (cmd_bench, cmd_certs, cmd_demo, cmd_drill, cmd_proxy, cmd_replay, cmd_services,
                                cmd_simulate)
from twinflow.cli_tail import cmd_tail
from twinflow.cli_validate import cmd_validate




class _OldName(argparse.Action):
    """A flag under the name that scripts written for it may still pass: works as ``new`` does,
    and says on stderr which name to use."""

    def __init__(self, option_strings, dest, new: str, append: bool = False, **kwargs):
        self.new, self.append = new, append
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"twinflow: {option_string} is deprecated, use {self.new} (a twinflow run process is a peer; "
              f"a node is a node of the flow graph)", file=sys.stderr)
        if self.append:
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


def _security_flags(parser, serving: bool, title: str = "gRPC security (over the flow file's security section)",
                    description: str | None = None) -> None:
    """``run``'s gRPC options (``serving``: its server's certificate, mutual TLS, --insecure), or
    an operator command's, :func:`~twinflow.cli_common.operator_security_flags`."""
    if not serving:
        operator_security_flags(parser)
        return
    g = parser.add_argument_group(title, description)
    g.add_argument("--tls-cert", metavar="PEM", help="this peer's certificate (its gRPC server; and its "
                                                      "client certificate with --tls-mutual)")
    g.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    g.add_argument("--tls-mutual", action="store_true", help="ask for and check client certificates "
                                                             "signed by --tls-ca (peer to peer)")
    g.add_argument("--insecure", action="store_true",
                   help="serve a non-loopback --listen without TLS and tokens (warned at start and "
                        "every minute)")
    g.add_argument("--tls-ca", metavar="PEM", help="the CA that signed the peers' certificates")
    g.add_argument("--tls-server-name", metavar="NAME", help="the name to check in a peer's certificate "
                                                             "when it is not the host dialled")
    g.add_argument("--token", action="append", metavar="SCOPE=REF",
                   help="a token for ingest, escalation, admin or read (optional: what may call Status and "
                        "Failures besides admin), named as file:PATH or env:NAME (never the token itself); "
                        "repeatable")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twinflow", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"twinflow {__version__}")
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="the log on stderr as text lines (default) or one JSON object per line (docs/reference/logs.md)")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one peer of a flow (master or worker of each pair, as elected)")
    r.add_argument("flow", help="flow file (YAML)")
    r.add_argument("--peer-id", help="this peer's name, unique in the flow (required)")
    r.add_argument("--node-id", dest="peer_id", action=_OldName, new="--peer-id")
    r.add_argument("--redis", help="Redis URL, e.g. redis://10.0.0.5:6379/0")
    r.add_argument("--zk", help="ZooKeeper connect string, e.g. zk1:2181,zk2:2181,zk3:2181")
    r.add_argument("--spark-master", help="Spark master URL (default local[1]; spark://HOST:PORT for a "
                                          "standalone cluster, whose executors run a sharded flow's shards)")
    r.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for this peer's session, e.g. spark.cores.max=2 (repeatable)")
    r.add_argument("--listen", default="127.0.0.1:0", help="gRPC bind address (default 127.0.0.1:0)")
    r.add_argument("--advertise", help="gRPC address other peers dial (default: the bound one)")
    r.add_argument("--state-dir", default=".twinflow", help="where Spark checkpoints live")
    r.add_argument("--start-from", choices=START_FROM, default=os.environ.get("TWINFLOW_START_FROM") or None,
                   help="a new state dir on a flow that has processed entries: read after the flow's "
                        "processed mark, or re-read the whole uplink (nothing processed is delivered again); "
                        "env TWINFLOW_START_FROM")
    r.add_argument("--worker-pace-ms", type=int, default=250,
                   help="as worker, plan an uplink batch at most this often (default 250; 0: as fast as the "
                        "master); fewer, larger worker batches leave the cores to the master")
    r.add_argument("--worker-read-behind-ms", type=int, default=3000,
                   help="as worker, read no uplink entry newer than this (default 3000; 0: read at once); what a "
                        "worker reads behind its master is mostly processed already and skipped, not baked")
    r.add_argument("--connect-timeout", type=float, default=60.0,
                   help="seconds to wait for Redis and ZooKeeper at start (default 60)")
    r.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics over HTTP here (e.g. 127.0.0.1:9464; default: none)")
    r.add_argument("--console-listen", metavar="HOST:PORT",
                   help="serve the operator console here, and the metrics beside it (HTTPS with the peer's "
                        "certificate; another address than loopback needs TLS and tokens; default: none)")
    r.add_argument("--console-allow-host", action="append", metavar="NAME",
                   help="a name the console (and the metrics beside it) answers to besides the address dialled, "
                        "localhost and its certificate's names: each request's Host must be one (repeatable)")
    r.add_argument("--batch-log", metavar="FILE",
                   help="append where each batch run as master spends its time (reading, decoding, the graph, the "
                        "COMMIT, escalation, idle...) to FILE, one JSON line a batch; {peer} in FILE becomes the peer's ID "
                        "(default: none, nothing timed)")
    _security_flags(r, serving=True)
    r.set_defaults(fn=cmd_run)

    va = sub.add_parser("validate", help="check flow files without running them: every refusal at once, each with "
                                          "file, line, field and reason (exit 0: none)")
    va.add_argument("flows", nargs="+", metavar="FLOW", help="flow files (YAML)")
    va.add_argument("--replay", action="store_true",
                    help="check for twinflow replay only: skip the checks twinflow run makes before it starts "
                         "(an uplink section, nodes that keep their state in Redis)")
    va.add_argument("--json", action="store_true", help="print one JSON object (ok, files, errors) instead of lines")
    va.set_defaults(fn=cmd_validate)

    for name, fn, helptext in (("status", cmd_status, "each peer's role, epoch, lag and counts"),
                               ("handover", cmd_handover, "move the master role to another peer")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("flow", help="flow file (YAML)")
        s.add_argument("--redis")
        if name == "status":
            s.add_argument("--json", action="store_true")
            s.add_argument("--peer", action="append", metavar="HOST:PORT",
                           help="a peer's gRPC address, asked when Redis does not answer "
                                "(default: the peers the last status found)")
            s.add_argument("--node", dest="peer", action=_OldName, new="--peer", append=True)
            s.add_argument("--wait-streaming", metavar="PEER_ID",
                           help="first wait until this peer streams (a restarted one: its new process), "
                                "then print; exit 1 after --wait-timeout")
            s.add_argument("--wait-timeout", type=float, default=300.0, metavar="S",
                           help="how long --wait-streaming waits (default 300)")
            s.add_argument("--grpc", action="store_true",
                           help="ask each --peer over gRPC and not Redis: checks that the peers take this "
                                "command's certificate, CA and token, read or admin (exit 3 when one does not "
                                "answer)")
        else:
            s.add_argument("--timeout", type=float, default=5.0)
        operator_security_flags(s, reads=name == "status")  # status only reads
        s.set_defaults(fn=fn)

    rs = sub.add_parser("resume", help="end a flow's suspensions now (an action's retries used up, "
                                       "on_retry_failure: suspend)")
    rs.add_argument("flow", help="flow file (YAML)")
    rs.add_argument("--redis", help="Redis URL (the default way in)")
    rs.add_argument("--peer", action="append", metavar="HOST:PORT",
                    help="go through this peer's Admin service instead of Redis (repeatable: the first that answers)")
    rs.add_argument("--by", help="who resumes it, for the log (default: this user)")
    operator_security_flags(rs)
    rs.set_defaults(fn=cmd_resume)

    fl = sub.add_parser("failures", help="the audit of failed messages: list, show, resubmit (exactly once "
                                         "more) or discard them (docs/operations/failures.md)")
    fl.add_argument("action", choices=["list", "show", "resubmit", "discard"])
    fl.add_argument("flow", help="flow file (YAML)")
    fl.add_argument("ids", nargs="*", metavar="AUDIT_ID", help="show: one audit ID; resubmit, discard: the "
                                                               "entries to act on (or --all)")
    fl.add_argument("--redis", help="Redis URL (the default way in)")
    fl.add_argument("--peer", action="append", metavar="HOST:PORT",
                    help="go through this peer's Admin service instead of Redis (repeatable: the first "
                         "that answers)")
    fl.add_argument("--node", help="only entries of the messages that failed at this flow node")
    fl.add_argument("--reason", metavar="TEXT", help="only entries whose reason contains TEXT")
    fl.add_argument("--since", metavar="TIME", help="only entries written at or after TIME (epoch seconds, "
                                                   "an ISO time, or a span ago such as 2h)")
    fl.add_argument("--until", metavar="TIME", help="only entries written at or before TIME")
    fl.add_argument("--status", type=str.upper, choices=["FAILED", "RESUBMITTED", "DISCARDED", "ANY"],
                    default="FAILED", help="list: entries of this status (default FAILED)")
    fl.add_argument("--limit", type=int, default=100, help="list: at most this many (default 100)")
    fl.add_argument("--after", metavar="AUDIT_ID", help="list: the entries after this one")
    fl.add_argument("--all", action="store_true",
                    help="resubmit, discard: every FAILED entry the filters take")
    fl.add_argument("--by", metavar="NAME", help="resubmit, discard: the operator to record (default: "
                                                 "the OS user)")
    fl.add_argument("--json", action="store_true")
    operator_security_flags(fl, reads=True)  # list and show only read; resubmit and discard send admin
    fl.set_defaults(fn=cmd_failures)

    co = sub.add_parser("console", help="serve the operator console of a flow's cluster: a live page of the flow, "
                                         "its peers, failovers and failed messages (docs/operations/console.md)")
    co.add_argument("flow", help="flow file (YAML)")
    co.add_argument("--listen", default="127.0.0.1:8470",
                    help="HTTP(S) bind address (default 127.0.0.1:8470; another address needs TLS and tokens)")
    co.add_argument("--redis", help="Redis URL (default: TWINFLOW_REDIS, else the local one)")
    co.add_argument("--reports", metavar="DIR", help="show the drill results (*.jsonl) found in DIR")
    co.add_argument("--handover-timeout", type=float, default=10.0, metavar="S",
                    help="how long a handover asked from the page may take (default 10)")
    co.add_argument("--allow-host", action="append", metavar="NAME",
                    help="a name the console answers to besides the address dialled, localhost and its "
                         "certificate's names: each request's Host must be one (repeatable)")
    _security_flags(co, serving=True, title="security (over the flow file's security section)",
                    description="--tls-cert and --tls-key: the console's HTTPS certificate; --token read=REF and "
                                "admin=REF: the tokens it accepts (admin's also sent to the master for a handover); "
                                "--tls-ca (env TWINFLOW_TLS_CA): to dial the peers")
    co.set_defaults(fn=cmd_console)

    pb = sub.add_parser("publish", help="send JSON messages (one per line, from stdin or --file) into a flow's "
                                        "uplink through a peer's Ingest service; prints each one's position")
    pb.add_argument("flow", help="flow file (YAML)")
    pb.add_argument("--peer", action="append", required=True, metavar="HOST:PORT",
                    help="a peer's gRPC address (repeatable: the first that answers takes the messages)")
    pb.add_argument("--file", action="append", metavar="PATH", help="read the messages from PATH (repeatable) "
                                                                    "instead of stdin")
    pb.add_argument("--deadline", type=float, default=30.0, metavar="S",
                    help="give up after S seconds, retries included (default 30)")
    operator_security_flags(pb, scopes=("ingest",))
    pb.set_defaults(fn=cmd_publish)

    tl = sub.add_parser("tail", help="follow one of a flow's streams, one JSON line per entry "
                                     "(docs/operations/consuming.md)")
    tl.add_argument("stream", metavar="STREAM", help="a stream the flow writes (sink, out:NODE:OUTLINK, failure, "
                                                     "notices), an outlink's as NODE.OUTLINK, or the uplink")
    tl.add_argument("flow", help="flow file (YAML)")
    tl.add_argument("--redis", help="Redis URL")
    tl.add_argument("--group", metavar="G", help="read as a consumer of this consumer group (it must exist), "
                                                "acknowledging each entry once printed")
    tl.add_argument("--consumer", metavar="C", help="with --group: the consumer's name")
    tl.add_argument("--from-start", action="store_true",
                    help="first every entry the stream holds (with --group: the entries given to this consumer "
                         "and never acknowledged); default: only new ones")
    tl.add_argument("--count", type=_positive, metavar="N", help="stop after N entries (default: follow until "
                                                                 "Ctrl-C or SIGTERM)")
    tl.add_argument("--shard", type=int, metavar="K", help="a sharded flow's shard whose stream to follow")
    tl.set_defaults(fn=cmd_tail)

    bk = sub.add_parser("backup", help="copy every Redis key of a flow at one instant, while it runs, to a file "
                                       "(docs/operations/deploy.md)")
    bk.add_argument("flow", help="flow file (YAML)")
    bk.add_argument("out", metavar="OUT", help="the file to write (atomically: the old one stays until the new "
                                               "one is whole)")
    bk.add_argument("--redis", help="Redis URL")
    bk.add_argument("--max-pause-ms", type=_positive, metavar="MS",
                    help="the longest the flow's writes may wait for the copy; a copy that would take longer is "
                         "abandoned, nothing written (default: half the flow's cluster.write_lease)")
    bk.set_defaults(fn=cmd_backup)

    rt = sub.add_parser("restore", help="put a backup's keys into Redis with a new fencing epoch; the flow's "
                                        "peers must be stopped (docs/operations/deploy.md)")
    rt.add_argument("flow", help="flow file (YAML)")
    rt.add_argument("file", metavar="IN", help="a file twinflow backup wrote")
    rt.add_argument("--redis", help="Redis URL")
    rt.add_argument("--zk", help="ZooKeeper connect string (the flow's epoch is taken there)")
    rt.add_argument("--replace", action="store_true",
                    help="delete the keys of the flow Redis holds, and put the backup's in their place")
    rt.add_argument("--wait-stopped", type=float, default=10.0, metavar="S",
                    help="how long to wait for the member znode and status of a peer stopped just now to go "
                         "(default 10)")
    rt.add_argument("--connect-timeout", type=float, default=10.0, metavar="S",
                    help="seconds to wait for ZooKeeper (default 10)")
    rt.set_defaults(fn=cmd_restore)

    rp = sub.add_parser("replay", help="run a flow over recorded events on a virtual clock")
    rp.add_argument("flow", help="flow file (YAML)")
    rp.add_argument("events", help="JSON Lines: {\"at\": seconds, \"id\": ..., ...fields}")
    rp.add_argument("--until", type=float, help="move the clock to this time after the last event "
                                                 "(default: until every deadline has fired)")
    rp.set_defaults(fn=cmd_replay)

    sv = sub.add_parser("services", help="local redis-server and ZooKeeper for development")
    sv.add_argument("action", choices=["up", "status", "down"])
    sv.add_argument("--state", default=str(SERVICES_STATE))
    sv.set_defaults(fn=cmd_services)

    lb = sub.add_parser("lab", help="a lab of hosts on this machine: each a network namespace with its own "
                                     "address on a private bridge (root; docs/contributing/lab.md)")
    lb.add_argument("action", choices=["up", "status", "console", "down"],
                    help="console: a lab peer's operator console forwarded to this machine, until Ctrl-C")
    lb.add_argument("--short", action="store_true",
                    help="up: the short form (one Redis, one ZooKeeper, two peers with Spark in local mode, the "
                         "client) instead of the full one (Sentinels, a ZooKeeper ensemble, a Spark cluster)")
    lb.add_argument("--guide", action="store_true",
                    help="up: the deployment guide's three machines, set up by running its command blocks "
                         "(docs/operations/deploy.md; --dir must be searchable by other users)")
    lb.add_argument("--dir", default=str(LAB_DIR), help="the lab's state file, secrets and logs (default .twinflow/lab)")
    lb.add_argument("--prefix", default=None,
                    help="up: the start of every namespace name (default tflab-, tfguide- with --guide); two labs "
                         "at once need two")
    lb.add_argument("--peer", default="peer-a", help="console: whose console (default peer-a)")
    lb.add_argument("--listen", default="127.0.0.1:8470", metavar="HOST:PORT",
                    help="console: where on this machine (default 127.0.0.1:8470)")
    lb.set_defaults(fn=cmd_lab)

    x = sub.add_parser("proxy", help="run the Toxiproxy-compatible fault proxy in the foreground")
    x.add_argument("--host", default="127.0.0.1")
    x.add_argument("--port", type=int, default=8474, help="the HTTP API's port (default 8474; 0: any free one)")
    x.set_defaults(fn=cmd_proxy)

    dr = sub.add_parser("drill", help="run a chaos drill on a fresh local cluster and check the promises")
    dr.add_argument("name", help="a drill name, or all (with --hosts: all, guide-all, or names of one of the two separated by commas)")
    dr.add_argument("--seed", type=int, default=1)
    dr.add_argument("--runs", type=int, default=1, help="run each drill this many times, seeds S, S+1, ...")
    dr.add_argument("--messages", type=int, default=10_000)
    dr.add_argument("--rate", type=float, default=None,
                    help="messages per second the producer sends (default 1000; 60 for the guarded-handler drills; between hosts, the drill's own)")
    dr.add_argument("--hosts", action="store_true",
                    help="a drill between the hosts of a fresh full lab (root): host-partition, "
                         "asymmetric-partition, host-crash, spark-worker-crash, rolling-restart, clock-skew, or all")
    dr.add_argument("--flow", help="flow file (default: the chained flow); its messages are made from its own "
                                   "fields; `all` runs the drills that apply to it and lists the others with "
                                   "the reason (docs/contributing/drills.md)")
    dr.add_argument("--samples", metavar="FILE",
                    help="with --flow: example messages, one JSON object a line; the producer sends copies of "
                         "them, each with a fresh ID and a growing sort key")
    dr.add_argument("--wait-replicas", type=int, default=None,
                    help="cluster.wait_replicas for the flow and the producer's WAIT (default: 1 for "
                         "redis-failover and redis-cluster-failover, the flow's own for the others)")
    dr.add_argument("--json", action="store_true", help="one JSON object per drill")
    dr.add_argument("--report", help="write a PNG timeline per drill and report.md here "
                                     "(default for `all`: drill-report)")
    dr.set_defaults(fn=cmd_drill)

    sm = sub.add_parser("simulate", help="seeded failover simulation of the peer code on a virtual clock")
    sm.add_argument("--seed", type=int, default=1, help="the first run's seed (runs use seed, seed+1, ...)")
    sm.add_argument("--runs", type=int, default=1000)
    sm.add_argument("--steps", type=int, default=200, help="steps with faults per run (then it settles)")
    sm.add_argument("--messages", type=int, default=40, help="messages the producer publishes per run")
    sm.add_argument("--flow", help="flow file (default: the kind's; one with uplink.shards runs as sharded); "
                                   "its messages are made from its own fields (docs/contributing/simulator.md)")
    sm.add_argument("--samples", metavar="FILE",
                    help="with --flow: example messages, one JSON object a line; the producer sends copies of "
                         "them, each with a fresh ID and a growing sort key")
    sm.add_argument("--kind", choices=("pair", "chained", "sharded", "rulesets", "guarded"), default="chained",
                    help="the built-in flow: the claim pair alone, the chained flow (default), the chained "
                         "flow in two uplink shards run on simulated executors, the claim pair's rulesets "
                         "(examples/cluster-claim-rulesets.yaml), or a handler guarded by the history, with "
                         "retries and suspend (examples/cluster-guarded.yaml)")
    sm.add_argument("--no-wait", action="store_true",
                    help="Redis failovers without cluster.wait_replicas: what they lose is counted, not failed")
    sm.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: one per CPU)")
    sm.add_argument("--trace", action="store_true", help="with --runs 1: print the whole step trace")
    sm.add_argument("--trace-lines", type=int, default=60, help="trace lines printed per failed run")
    sm.add_argument("--json", action="store_true")
    sm.set_defaults(fn=cmd_simulate)

    b = sub.add_parser("bench", help="measure the two-peer cluster against two bare Spark readers on this machine")
    b.add_argument("which", choices=("flow-vs-passthrough",))
    b.add_argument("--messages", type=int, default=50_000, help="messages in the burst (default 50,000)")
    b.add_argument("--rate", type=float, default=2000.0, help="steady rate for latency (default 2,000/s)")
    b.add_argument("--seconds", type=float, default=15.0, help="how long the steady load lasts (default 15)")
    b.add_argument("--rounds", type=int, default=5,
                   help="rounds of a burst and a steady load on each side, interleaved; every figure is the "
                        "median and spread of the rounds (default 5)")
    b.add_argument("--batch-size", type=int, default=10_000,
                   help="a bare reader's largest batch (default 10,000)")
    b.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    b.set_defaults(fn=cmd_bench)

    d = sub.add_parser("demo", help="two peers, a SIGKILL of the master mid-stream, and the count")
    d.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    d.add_argument("--messages", type=int, default=3000)
    d.add_argument("--rate", type=float, default=600.0, help="messages per second (default 600)")
    d.add_argument("--kill-at", type=float, default=0.4, help="kill the master after this share of messages")
    d.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    d.add_argument("--flow", choices=("chained", "claim-pair"), default="chained",
                   help="chained: history -> AND join -> action (default); claim-pair: the action alone")
    d.add_argument("--console", metavar="HOST:PORT",
                   help="serve the operator console here while the demo runs, and keep the cluster running "
                        "after the count until Ctrl-C (e.g. 127.0.0.1:8470)")
    d.set_defaults(fn=cmd_demo)

    c = sub.add_parser("certs", help="a development CA, a peer certificate and tokens (docs/operations/security.md)")
    c.add_argument("dir", help="where to write them (the CA and tokens there are reused)")
    c.add_argument("--peer", help="the peer's name: <peer>.pem and <peer>-key.pem (required)")
    c.add_argument("--node", dest="peer", action=_OldName, new="--peer")
    c.add_argument("--name", action="append", metavar="HOST_OR_IP",
                   help="a DNS name or IP address others dial the peer by (repeatable; default: --peer)")
    c.add_argument("--days", type=int, default=365,
                   help="how long the peer's certificate is valid (default 365; never past the CA's end: "
                        "capped there, with a warning)")
    c.add_argument("--ca-days", type=int, default=3650,
                   help="how long a new CA is valid, when the directory has none (default 3650, ten years)")
    c.set_defaults(fn=cmd_certs)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    from twinflow import logs

    logs.configure(logging.DEBUG if args.verbose else logging.INFO, args.log_format)
    if args.fn in (cmd_drill, cmd_demo, cmd_bench, cmd_lab):
        # SIGTERM unwinds like Ctrl-C, so the servers and peers these started are stopped by PID.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
