"""The ``twinflow`` command: run a node, inspect a flow, manage local services, run the demo.

Addresses come from flags, else from the environment (TWINFLOW_REDIS,
TWINFLOW_ZK, TWINFLOW_SPARK_MASTER), else from the local services that
``twinflow services up`` recorded in .twinflow/services.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

SERVICES_STATE = Path(".twinflow") / "services.json"

EXIT_BAD_FLOW = 2
EXIT_UNAVAILABLE = 3
EXIT_REFUSED = 4


def _local_services():
    from twinflow.testing.services import LocalServices

    return LocalServices.load(SERVICES_STATE) if SERVICES_STATE.exists() else None


def _address(flag: str | None, env: str, kind: str) -> str:
    if flag:
        return flag
    if os.environ.get(env):
        return os.environ[env]
    svc = _local_services()
    if svc is not None:
        return svc.redis_url if kind == "redis" else svc.zk_hosts
    raise SystemExit(f"twinflow: no {kind} address: pass --{kind}, set {env}, or run `twinflow services up`")


def _load_flow(path: str, cluster: bool = True):
    """The flow graph, or exit EXIT_BAD_FLOW naming what is wrong; ``cluster``: it must run on the cluster."""
    from twinflow.runtime.flowgraph import FlowFileError, load_graph

    try:
        graph = load_graph(path)
    except FlowFileError as exc:
        print(f"twinflow: flow file refused: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_FLOW) from None
    if cluster:
        from twinflow.cluster.on_cluster import StartRefused, cluster_flow

        try:
            cluster_flow(graph)
        except StartRefused as exc:
            print(f"twinflow: flow file refused: {exc}", file=sys.stderr)
            raise SystemExit(EXIT_BAD_FLOW) from None
    return graph


# -- run ---------------------------------------------------------------------
START_FROM = ("processed", "beginning")  # where a node with a new state dir may start (NodeConfig.start_from)


def _spark_conf(pairs: list[str]) -> dict:
    conf = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.startswith("spark."):
            raise SystemExit(f"twinflow: --spark-conf {pair!r}: expected spark.KEY=VALUE")
        conf[key] = value
    return conf


def _grpc_security(args, graph):
    """The flow file's ``security`` section with the command line's TLS and token settings over it;
    exits EXIT_BAD_FLOW naming the file or setting that cannot be used (never a secret's value)."""
    from twinflow.grpc_security import SecurityConfigError, security_from
    from twinflow.secrets import SecretError

    refs = {}
    for pair in getattr(args, "token", None) or []:
        scope, eq, ref = pair.partition("=")
        if not eq:
            raise SystemExit(f"twinflow: --token {scope[:12]}...: expected SCOPE=file:PATH or SCOPE=env:NAME")
        refs[scope] = ref
    try:
        return security_from(graph.cluster.security if graph.cluster else None, cert=getattr(args, "tls_cert", None),
                             key=getattr(args, "tls_key", None), ca=args.tls_ca, mutual=getattr(args, "tls_mutual", False),
                             server_name=args.tls_server_name, token_refs=refs,
                             insecure=getattr(args, "insecure", False))
    except (SecurityConfigError, SecretError) as exc:
        print(f"twinflow: gRPC security settings refused: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_FLOW) from None


def _security_flags(parser, serving: bool) -> None:
    g = parser.add_argument_group("gRPC security (over the flow file's security section)")
    if serving:
        g.add_argument("--tls-cert", metavar="PEM", help="this node's certificate (its gRPC server; and its "
                                                          "client certificate with --tls-mutual)")
        g.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
        g.add_argument("--tls-mutual", action="store_true", help="ask for and check client certificates "
                                                                 "signed by --tls-ca (node to node)")
        g.add_argument("--insecure", action="store_true",
                       help="serve a non-loopback --listen without TLS and tokens (warned at start and "
                            "every minute)")
    g.add_argument("--tls-ca", metavar="PEM", help="the CA that signed the nodes' certificates")
    g.add_argument("--tls-server-name", metavar="NAME", help="the name to check in a node's certificate "
                                                             "when it is not the host dialled")
    g.add_argument("--token", action="append", metavar="SCOPE=REF",
                   help="a token for ingest, escalation or admin, named as file:PATH or env:NAME (never "
                        "the token itself); repeatable")


def cmd_run(args) -> int:
    # The node's only fork is Spark's JVM launch, an immediate exec: gRPC's
    # fork handlers have nothing to protect there and can break it.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    from twinflow.cluster.connect import ServiceUnavailable
    from twinflow.cluster.node import FlowNode
    from twinflow.cluster.real_parts import RealParts
    from twinflow.cluster.host import NodeConfig
    from twinflow.cluster.on_cluster import StartRefused
    from twinflow.grpc_security import SecurityConfigError
    from twinflow.cluster.zk_auth import ZkAccessDenied
    from twinflow.runtime.store.redis_auth import RedisSettingsError
    from twinflow.secrets import SecretError

    graph = _load_flow(args.flow)
    cfg = NodeConfig(
        node_id=args.node_id,
        redis_url=_address(args.redis, "TWINFLOW_REDIS", "redis"),
        zk_hosts=_address(args.zk, "TWINFLOW_ZK", "zk"),
        listen=args.listen,
        advertise=args.advertise,
        spark_master=args.spark_master or os.environ.get("TWINFLOW_SPARK_MASTER", "local[1]"),
        spark_conf=_spark_conf(args.spark_conf),
        state_dir=args.state_dir,
        connect_deadline_s=args.connect_timeout,
        start_from=args.start_from,
        worker_pace_ms=args.worker_pace_ms,
        security=_grpc_security(args, graph),
        metrics_listen=args.metrics_listen,
    )
    try:  # before anything starts: a refused bind must not wait for Spark to come up first
        cfg.security.check_bind(cfg.listen)
    except SecurityConfigError as exc:
        print(f"twinflow: refused to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if graph.cluster is not None and (graph.cluster.shards > 1 or not cfg.spark_master.startswith("local")):
        # On a Spark cluster, or with shards, the flow's work runs on the executors.
        from twinflow.cluster.sharded_node import ShardedNode

        node = ShardedNode(graph, cfg)
    else:
        node = FlowNode(graph, cfg, parts=RealParts())
    signal.signal(signal.SIGTERM, lambda *_: node.request_term())
    try:
        return node.run_forever()
    except ServiceUnavailable as exc:
        print(f"twinflow: {exc}", file=sys.stderr)
        node.stop()
        return EXIT_UNAVAILABLE
    except (StartRefused, SecurityConfigError, RedisSettingsError, SecretError, ZkAccessDenied) as exc:
        print(f"twinflow: refused to start: {exc}", file=sys.stderr)
        node.stop()
        return EXIT_REFUSED
    except KeyboardInterrupt:
        node.stop()
        return 130


# -- status / handover -------------------------------------------------------
STATUS_COLUMNS = ["node_id", "role", "epoch", "uplink_lag", "baked", "claimed", "rolled_back",
                  "delivered", "failed", "unclaimed", "backpressure", "redis", "grpc_address"]
# The nodes `twinflow status` last found in Redis, asked over gRPC when Redis does not answer.
NODES_SEEN = Path(".twinflow") / "nodes-{flow}.json"


def _flow_stores(args):
    """The flow and one store per uplink shard (one for an unsharded flow)."""
    import redis

    from twinflow.cluster.on_cluster import flow_keys
    from twinflow.runtime.shards import shard_graph
    from twinflow.runtime.store.flow_store import FlowStore
    from twinflow.runtime.store.redis_slot import client_from_url

    graph = _load_flow(args.flow)
    url = _address(args.redis, "TWINFLOW_REDIS", "redis")
    stores = []
    for k in range(graph.cluster.shards if graph.cluster else 1):
        keys = flow_keys(shard_graph(graph, k))
        try:
            client = client_from_url(url, socket_connect_timeout=3, slot_key=keys.uplink)
        except redis.RedisError:  # down: the command's first call reports it
            client = client_from_url(url, socket_connect_timeout=3)  # no round trip: cannot fail
        stores.append(FlowStore(client, keys, "cli"))
    return graph, stores


def cmd_status(args) -> int:
    import redis

    from twinflow.runtime.store.store_errors import RedisUnavailable
    from twinflow.secrets import redact_text, redact_url

    graph, stores = _flow_stores(args)
    store = stores[0]
    seen = Path(str(NODES_SEEN).format(flow=graph.name))
    try:
        rows = []
        for shard in stores:  # a sharded flow: a row per node and shard
            for row in shard.read_statuses(deadline_s=3.0):
                row["uplink_lag"] = shard.uplink_lag(row["node_id"])  # live lag, not the one cached
                rows.append(row)
        seen.parent.mkdir(parents=True, exist_ok=True)
        seen.write_text(json.dumps(sorted({r["grpc_address"] for r in rows if r.get("grpc_address")})))
    except (redis.RedisError, RedisUnavailable) as exc:
        # Redis is down: ask the nodes themselves (they report it, and whether they read).
        print(f"twinflow: Redis at {redact_url(_address(args.redis, 'TWINFLOW_REDIS', 'redis'))} did not answer: "
              f"{redact_text(str(exc))}", file=sys.stderr)
        rows = _statuses_over_grpc(args.node or (json.loads(seen.read_text()) if seen.exists() else []),
                                   _grpc_security(args, graph))
        if not rows:
            print("twinflow: no node answered over gRPC either (pass --node HOST:PORT)", file=sys.stderr)
            return EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps({"flow": graph.name, "nodes": rows}))
        return 0
    if not rows:
        print(f"flow {graph.name}: no live nodes")
        return 0
    columns = STATUS_COLUMNS if len(stores) == 1 else ["flow", *STATUS_COLUMNS]
    print(_table(columns, [[r.get(c, "") for c in columns] for r in rows]))
    return 0


def _statuses_over_grpc(addresses: list[str], security) -> list[dict]:
    from twinflow.client import node_status

    rows = []
    for address in addresses:
        try:
            rows.append(node_status(address, timeout_s=3.0, security=security))
        except Exception as exc:  # a node that is gone: say so, ask the next
            print(f"twinflow: node at {address} did not answer: {exc}", file=sys.stderr)
    return rows


def cmd_handover(args) -> int:
    from twinflow.client import request_handover

    graph, stores = _flow_stores(args)
    security = _grpc_security(args, graph)
    # One master per shard; a node hands over every shard it is master of.
    masters = sorted({r["grpc_address"] for store in stores for r in store.read_statuses()
                      if r.get("role") == "master"})
    if not masters:
        print("twinflow: no live master found", file=sys.stderr)
        return 1
    results = [request_handover(address, timeout_s=args.timeout, security=security) for address in masters]
    for result in results:
        print(json.dumps(result))
    return 0 if all(r.get("ok") for r in results) else 1


def _table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- services ----------------------------------------------------------------
def cmd_services(args) -> int:
    from twinflow.testing.services import LocalServices, ServiceError

    state = Path(args.state)
    if args.action == "up":
        if state.exists():
            svc = LocalServices.load(state)
            if all(s["answers"] for s in svc.status().values()):
                print(f"already up: redis {svc.redis_url}  zookeeper {svc.zk_hosts}")
                return 0
            svc.stop()
        try:
            svc = LocalServices.start(base_dir=str(state.parent.resolve() / "services"))
        except ServiceError as exc:
            print(f"twinflow: {exc}", file=sys.stderr)
            return 1
        svc.save(state)
        print(f"redis     {svc.redis_url}\nzookeeper {svc.zk_hosts}")
        return 0
    if not state.exists():
        print("no local services recorded (twinflow services up starts them)")
        return 0 if args.action == "down" else 1
    svc = LocalServices.load(state)
    if args.action == "status":
        rows = [[name, s["address"], s["pid"], "yes" if s["alive"] else "no", "yes" if s["answers"] else "no", s["log"]]
                for name, s in svc.status().items()]
        print(_table(["service", "address", "pid", "alive", "answers", "log"], rows))
        return 0 if all(r[4] == "yes" for r in rows) else 1
    svc.stop()
    state.unlink()
    print("stopped")
    return 0


# -- replay -------------------------------------------------------------------
def cmd_replay(args) -> int:
    from twinflow.runtime.replay import replay

    graph = _load_flow(args.flow, cluster=False)
    bad = []

    def report(number: int, reason: str) -> None:
        bad.append(number)
        print(f"{args.events}:{number}: {reason}", file=sys.stderr)

    try:
        events = open(args.events)
    except OSError as exc:
        print(f"twinflow: cannot read {args.events}: {exc.strerror}", file=sys.stderr)
        return 1
    with events:
        for line in replay(graph, events, until=args.until, on_bad=report):
            print(json.dumps(line, default=str))
    if bad:
        print(f"twinflow: {len(bad)} bad event line(s) skipped", file=sys.stderr)
    return 1 if bad else 0


# -- proxy -------------------------------------------------------------------
def cmd_proxy(args) -> int:
    from twinflow.chaos.toxiproxy_api import serve_forever

    try:
        serve_forever(args.host, args.port,
                      ready=lambda port: print(f"twinflow proxy: Toxiproxy API on {args.host}:{port}", flush=True))
    except KeyboardInterrupt:
        return 130
    except OSError as exc:
        print(f"twinflow: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    return 0


# -- drill -------------------------------------------------------------------
def _need_extra(extra: str, *modules: str) -> None:
    """Exit EXIT_UNAVAILABLE naming the extra to install when one of ``modules`` is missing: the
    chaos tools' dependencies are not a node's (``pip install 'twinflow[chaos]'``)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"twinflow: this command needs {', '.join(missing)}: pip install 'twinflow[{extra}]'", file=sys.stderr)
        raise SystemExit(EXIT_UNAVAILABLE)


# --json prints these (stale writes count into "passed"; the table shows them too).
DRILL_KEYS = ["drill", "seed", "messages", "lost", "duplicated", "out_of_order", "rto_s", "passed"]
DRILL_COLUMNS = DRILL_KEYS[:-2] + ["stale_writes", "rto_s", "passed"]


def cmd_drill(args) -> int:
    _need_extra("chaos", "toxiproxy", *(["matplotlib"] if args.report or args.name == "all" else []))
    from twinflow.chaos.drills import DRILLS, IN_NETNS, run_drill
    from twinflow.chaos.kernel_faults import KernelFaultsUnavailable, in_private_netns, netns_command

    names = list(DRILLS) if args.name == "all" else [args.name]
    if names[0] not in DRILLS:
        print(f"twinflow: unknown drill {args.name!r} (known: all, {', '.join(DRILLS)})", file=sys.stderr)
        return EXIT_BAD_FLOW
    if IN_NETNS & set(names) and not in_private_netns():
        # Kernel faults never touch this machine's own network: run the drills in a namespace of their own.
        try:
            argv = netns_command([sys.executable, "-m", "twinflow.cli", *args.argv])
        except KernelFaultsUnavailable as exc:
            print(f"twinflow: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        child = subprocess.Popen(argv)
        # The drill in the namespace stops its servers itself: pass SIGTERM on, let Ctrl-C reach it.
        signal.signal(signal.SIGTERM, lambda *_: child.terminate())
        signal.signal(signal.SIGINT, lambda *_: None)
        return child.wait()
    flow_text = None
    if args.flow:
        _load_flow(args.flow)  # refused here, with file, line and field, before anything starts
        flow_text = Path(args.flow).read_text()
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    results = []
    # --runs N: every drill with seeds S .. S+N-1, round by round, so a stopped batch covers every drill.
    plan = [(seed, name) for seed in range(args.seed, args.seed + args.runs) for name in names]
    for i, (seed, name) in enumerate(plan, 1):
        say(f"[{i}/{len(plan)}] drill {name} (seed {seed}, {args.messages} messages)...")
        try:
            result = run_drill(name, seed=seed, messages=args.messages, flow_text=flow_text, rate=args.rate,
                               say=say, wait_replicas=args.wait_replicas)
        except Exception as exc:  # the drill could not run to its check: a failure, with its reason
            rerun = f"twinflow drill {name} --seed {seed} --messages {args.messages}"
            result = {"drill": name, "seed": seed, "messages": args.messages, "lost": None, "duplicated": None,
                      "out_of_order": None, "rto_s": None, "passed": False, "rerun": rerun,
                      "error": f"{type(exc).__name__}: {exc}"[:2000]}
        results.append(result)
        if args.json:
            keys = DRILL_KEYS + [k for k in ("wait_replicas", "lost_in_uplink", "error") if k in result]
            print(json.dumps({k: result.get(k) for k in keys}), flush=True)
        else:
            say(f"  {'passed' if result['passed'] else 'FAILED'}: lost {result['lost']}, duplicated "
                f"{result['duplicated']}, rto {result['rto_s']} s" + (f"; {result['error']}" if "error" in result else ""))
            if not result["passed"]:
                say(f"  rerun: {result['rerun']}")
    if not args.json:
        print(_table(DRILL_COLUMNS, [[r.get(c) for c in DRILL_COLUMNS] for r in results]))
    report_dir = args.report or ("drill-report" if args.name == "all" else None)
    if report_dir:
        from twinflow.chaos.report import write_report

        say(f"report: {write_report(results, Path(report_dir), DRILL_COLUMNS)}")
    return 0 if all(r["passed"] for r in results) else 1


# -- simulate ----------------------------------------------------------------
def cmd_simulate(args) -> int:
    _need_extra("chaos", "fakeredis", "lupa")
    from twinflow.chaos.sim.simulator import run_once, simulate

    flow_text = None
    if args.flow:
        _load_flow(args.flow)
        flow_text = Path(args.flow).read_text()
    kind = None if args.flow else args.kind
    wait = not args.no_wait
    rerun = f"twinflow simulate --seed {{seed}} --runs 1 --steps {args.steps} --messages {args.messages}" + (
        f" --flow {args.flow}" if args.flow else f" --kind {args.kind}") + ("" if wait else " --no-wait")
    if args.runs == 1:  # one seed: its whole trace on request
        r = run_once(args.seed, args.steps, args.messages, flow_text, verbose=args.verbose, kind=kind, wait=wait)
        if args.trace or not r.passed:
            print("\n".join(r.trace), file=sys.stderr)
        out = {"runs": 1, "failed": int(not r.passed), **r.summary()}
        print(json.dumps(out) if args.json else _simulate_text(out, [r], rerun))
        return 0 if r.passed else 1
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    out = simulate(args.seed, args.runs, args.steps, args.messages, flow_text, jobs=args.jobs, say=say,
                   kind=kind, wait=wait)
    failures = out.pop("failures")
    samples = out.pop("with_expected", [])
    for r in failures:
        print("\n".join(r.trace[-args.trace_lines:]), file=sys.stderr)
    if args.json:
        print(json.dumps({**out, "failed_seeds": [r.seed for r in failures],
                          "expected": [f"seed {r.seed}: {p}" for r in samples for p in r.expected[:2]],
                          "problems": [p for r in failures for p in r.problems[:3]]}))
    else:
        print(_simulate_text(out, failures, rerun))
        if out.get("counts"):
            print("counts: " + ", ".join(f"{k} {v}" for k, v in out["counts"].items()))
        for r in samples[:5]:
            print(f"seed {r.seed} (no WAIT), what its failovers cost: " + "; ".join(r.expected[:2]))
    return 0 if not failures else 1


def _simulate_text(out: dict, failures: list, rerun: str) -> str:
    lines = [f"{out['runs']} runs, {out['failed']} failed"
             + (f" in {out['seconds']} s" if "seconds" in out else "")
             + (f"; {out.get('promotions', 0)} promotions, {out.get('faults', 0)} faults, "
                f"{out.get('sent', 0)} messages" if "sent" in out else "")]
    for r in failures:
        if r.passed:
            continue
        lines.append(f"seed {r.seed} FAILED: " + "; ".join(r.problems[:3]))
        lines.append("  rerun: " + rerun.format(seed=r.seed) + " --trace")
    return "\n".join(lines)


# -- bench -------------------------------------------------------------------
def cmd_bench(args) -> int:
    from twinflow.testing.flow_bench import Load, flow_vs_passthrough

    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    out = flow_vs_passthrough(Load(args.messages, args.rate, args.seconds), say)
    if args.json:
        print(json.dumps(out))
        return 0
    print(_table(["figure", "bare Spark passthrough", "twinflow pair (chained flow)"], [
        [f"burst of {out['messages']}, msg/s", f"{out['passthrough_msgs_per_s']:,} "
         f"(batch size {out['passthrough_batch_size']:,})", f"{out['flow_msgs_per_s']:,}"],
        ["ratio (pair / passthrough)", "", f"{out['ratio']:.2f}"],
        [f"latency at {out['rate']:.0f} msg/s, p50 / p99 ms", f"{out['passthrough_p50_ms']} / "
         f"{out['passthrough_p99_ms']}", f"{out['p50_latency_ms']} / {out['p99_latency_ms']}"],
    ]))
    return 0


# -- demo --------------------------------------------------------------------
def cmd_certs(args) -> int:
    from twinflow.certs import make_certs

    made = make_certs(args.dir, args.node, args.name or [args.node])
    for path in made:
        print(path)
    print(f"twinflow: {len(made)} files made in {args.dir}; name them in the flow file's security section "
          f"(docs/operations/security.md)", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from twinflow.testing.demo import run_demo

    result = run_demo(messages=args.messages, rate=args.rate, kill_at=args.kill_at,
                      progress=not args.json, keep=args.keep, flow=args.flow)
    if args.json:
        print(json.dumps(result))
    return 0 if result["lost"] == 0 and result["duplicated"] == 0 else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="twinflow", description=__doc__.splitlines()[0])
    p.add_argument("-v", "--verbose", action="store_true")
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="the log on stderr as text lines (default) or one JSON object per line (docs/reference/logs.md)")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one flow node (master or worker, as elected)")
    r.add_argument("flow", help="flow file (YAML)")
    r.add_argument("--node-id", required=True)
    r.add_argument("--redis", help="Redis URL, e.g. redis://10.0.0.5:6379/0")
    r.add_argument("--zk", help="ZooKeeper connect string, e.g. zk1:2181,zk2:2181,zk3:2181")
    r.add_argument("--spark-master", help="Spark master URL (default local[1]; spark://HOST:PORT for a "
                                          "standalone cluster, whose executors run a sharded flow's shards)")
    r.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                   help="a Spark setting for this node's session, e.g. spark.cores.max=2 (repeatable)")
    r.add_argument("--listen", default="127.0.0.1:0", help="gRPC bind address (default 127.0.0.1:0)")
    r.add_argument("--advertise", help="gRPC address other nodes dial (default: the bound one)")
    r.add_argument("--state-dir", default=".twinflow", help="where Spark checkpoints live")
    r.add_argument("--start-from", choices=START_FROM,
                   help="a new state dir on a flow that has processed entries: read after the flow's "
                        "processed mark, or re-read the whole uplink (nothing processed is delivered again)")
    r.add_argument("--worker-pace-ms", type=int, default=250,
                   help="as worker, plan an uplink batch at most this often (default 250; 0: as fast as the "
                        "master); fewer, larger worker batches leave the cores to the master")
    r.add_argument("--connect-timeout", type=float, default=60.0,
                   help="seconds to wait for Redis and ZooKeeper at start (default 60)")
    r.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="serve Prometheus metrics over HTTP here (e.g. 127.0.0.1:9464; default: none)")
    _security_flags(r, serving=True)
    r.set_defaults(fn=cmd_run)

    for name, fn, helptext in (("status", cmd_status, "each node's role, epoch, lag and counts"),
                               ("handover", cmd_handover, "move the master role to another node")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("flow", help="flow file (YAML)")
        s.add_argument("--redis")
        if name == "status":
            s.add_argument("--json", action="store_true")
            s.add_argument("--node", action="append", metavar="HOST:PORT",
                           help="a node's gRPC address, asked when Redis does not answer "
                                "(default: the nodes the last status found)")
        else:
            s.add_argument("--timeout", type=float, default=5.0)
        _security_flags(s, serving=False)
        s.set_defaults(fn=fn)

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

    x = sub.add_parser("proxy", help="run the Toxiproxy-compatible fault proxy in the foreground")
    x.add_argument("--host", default="127.0.0.1")
    x.add_argument("--port", type=int, default=8474, help="the HTTP API's port (default 8474; 0: any free one)")
    x.set_defaults(fn=cmd_proxy)

    dr = sub.add_parser("drill", help="run a chaos drill on a fresh local cluster and check the promises")
    dr.add_argument("name", help="a drill name, or all")
    dr.add_argument("--seed", type=int, default=1)
    dr.add_argument("--runs", type=int, default=1, help="run each drill this many times, seeds S, S+1, ...")
    dr.add_argument("--messages", type=int, default=10_000)
    dr.add_argument("--rate", type=float, default=1000.0, help="messages per second the producer sends")
    dr.add_argument("--flow", help="flow file (default: the chained flow)")
    dr.add_argument("--wait-replicas", type=int, default=None,
                    help="cluster.wait_replicas for the flow and the producer's WAIT (default: 1 for "
                         "redis-failover and redis-cluster-failover, the flow's own for the others)")
    dr.add_argument("--json", action="store_true", help="one JSON object per drill")
    dr.add_argument("--report", help="write a PNG timeline per drill and report.md here "
                                     "(default for `all`: drill-report)")
    dr.set_defaults(fn=cmd_drill)

    sm = sub.add_parser("simulate", help="seeded failover simulation of the node code on a virtual clock")
    sm.add_argument("--seed", type=int, default=1, help="the first run's seed (runs use seed, seed+1, ...)")
    sm.add_argument("--runs", type=int, default=1000)
    sm.add_argument("--steps", type=int, default=200, help="steps with faults per run (then it settles)")
    sm.add_argument("--messages", type=int, default=40, help="messages the producer publishes per run")
    sm.add_argument("--flow", help="flow file (default: the kind's; one with uplink.shards runs as sharded)")
    sm.add_argument("--kind", choices=("pair", "chained", "sharded"), default="chained",
                    help="the built-in flow: the claim pair alone, the chained flow (default), or the chained "
                         "flow in two uplink shards run on simulated executors")
    sm.add_argument("--no-wait", action="store_true",
                    help="Redis failovers without cluster.wait_replicas: what they lose is counted, not failed")
    sm.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes (default: one per CPU)")
    sm.add_argument("--trace", action="store_true", help="with --runs 1: print the whole step trace")
    sm.add_argument("--trace-lines", type=int, default=60, help="trace lines printed per failed run")
    sm.add_argument("--json", action="store_true")
    sm.set_defaults(fn=cmd_simulate)

    b = sub.add_parser("bench", help="measure the two-node cluster against bare Spark on this machine")
    b.add_argument("which", choices=("flow-vs-passthrough",))
    b.add_argument("--messages", type=int, default=50_000, help="messages in the burst (default 50,000)")
    b.add_argument("--rate", type=float, default=2000.0, help="steady rate for latency (default 2,000/s)")
    b.add_argument("--seconds", type=float, default=15.0, help="how long the steady load lasts (default 15)")
    b.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    b.set_defaults(fn=cmd_bench)

    d = sub.add_parser("demo", help="two nodes, a SIGKILL of the master mid-stream, and the count")
    d.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    d.add_argument("--messages", type=int, default=3000)
    d.add_argument("--rate", type=float, default=600.0, help="messages per second (default 600)")
    d.add_argument("--kill-at", type=float, default=0.4, help="kill the master after this share of messages")
    d.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    d.add_argument("--flow", choices=("chained", "claim-pair"), default="chained",
                   help="chained: history -> AND join -> action (default); claim-pair: the action alone")
    d.set_defaults(fn=cmd_demo)

    c = sub.add_parser("certs", help="a development CA, a node certificate and tokens (docs/operations/security.md)")
    c.add_argument("dir", help="where to write them (the CA and tokens there are reused)")
    c.add_argument("--node", required=True, help="the node's name: <node>.pem and <node>-key.pem")
    c.add_argument("--name", action="append", metavar="HOST_OR_IP",
                   help="a DNS name or IP address others dial the node by (repeatable; default: --node)")
    c.set_defaults(fn=cmd_certs)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    from twinflow import logs

    logs.configure(logging.DEBUG if args.verbose else logging.INFO, args.log_format)
    if args.fn in (cmd_drill, cmd_demo, cmd_bench):
        # SIGTERM unwinds like Ctrl-C, so the servers and nodes these started are stopped by PID.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
