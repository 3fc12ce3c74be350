"""The ``twinflow`` commands for development and drills: ``services``, ``replay``, ``proxy``,
``drill``, ``simulate``, ``bench``, ``certs``, ``demo``.

Under failure: the servers, peers and proxies a command started are stopped by PID when it
ends, also on SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from twinflow.cli_common import (EXIT_BAD_FLOW, EXIT_UNAVAILABLE, _load_flow, _need_extra, _table)

# --json prints these (stale writes count into "passed"; the table shows them too).
DRILL_KEYS = ["drill", "seed", "messages", "lost", "duplicated", "out_of_order", "rto_s", "passed"]
DRILL_COLUMNS = DRILL_KEYS[:-2] + ["stale_writes", "rto_s", "passed"]
# ... and these where a drill has them (the Redis failover drills, the drills between hosts, the guide's).
DRILL_EXTRA_KEYS = ["wait_replicas", "lost_in_uplink", "hosts", "rate", "rto_each_s", "max_gap_s", "stop_status",
                    "skew_s", "timeouts_after_failover", "timeout_error_ms_p50", "timeout_error_ms_min",
                    "timeout_error_ms_max", "version", "versions", "versions_after_rollback", "validate_refused", "refused",
                    "after_change", "after_rotation", "renewed_until", "owned_by_root", "topology",
                    "delivered_before_restore", "kept_logs", "ledger", "resubmit", "lost_ids", "duplicated_ids", "error"]


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
    for name, node in graph.nodes.items():  # RULE_PEND: what each sort still holds at the end
        if hasattr(node, "rule_pending"):
            print(f"twinflow: {name} rule_pending {json.dumps(node.rule_pending())}", file=sys.stderr)
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


def cmd_drill(args) -> int:
    if args.hosts:
        return cmd_host_drill(args)
    _need_extra("chaos", "toxiproxy", *(["matplotlib"] if args.report or args.name == "all" else []))
    from twinflow.chaos import guarded_drills
    from twinflow.chaos.drill_faults import DRILLS, GUARDED, IN_NETNS
    from twinflow.chaos.drill_fit import books_in_ledger, not_applicable
    from twinflow.chaos.drills import run_drill
    from twinflow.chaos.kernel_faults import KernelFaultsUnavailable, in_private_netns, netns_command

    names = list(DRILLS) if args.name == "all" else [args.name]
    if names[0] not in DRILLS:
        print(f"twinflow: unknown drill {args.name!r} (known: all, {', '.join(DRILLS)}; "
              f"between hosts, with --hosts: see twinflow drill --help)", file=sys.stderr)
        return EXIT_BAD_FLOW
    if args.samples and not args.flow:
        print("twinflow: --samples goes with --flow (the built-in flow has messages of its own)", file=sys.stderr)
        return EXIT_BAD_FLOW
    # Refused here, with file, line and field, before anything starts. Without --flow each drill
    # runs the flow made for it (the chained flow, the guarded one), which it always applies to.
    graph = _load_flow(args.flow) if args.flow else None
    skipped = {name: why for name in names if graph is not None and (why := not_applicable(name, graph))}
    runnable = [name for name in names if name not in skipped]
    if IN_NETNS & set(runnable) and not in_private_netns():
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
    if not runnable:  # nothing to run is no pass: say so, and why for each
        print_not_applicable(args, skipped)
        what = "no drill applies" if args.name == "all" else f"drill {args.name} does not apply"
        print(f"twinflow: {what} to {args.flow}", file=sys.stderr)
        return EXIT_BAD_FLOW
    flow_text, samples, ledger = None, None, False
    if graph is not None:
        flow_text = Path(args.flow).read_text()
        samples = _flow_messages(args, graph)
        ledger = books_in_ledger(graph)  # its handler writes into the ledger: prepare one, at its rate
        # The peers run a copy of the file elsewhere: they import its handlers from its folder, as
        # `twinflow run` of the file itself would (they inherit this environment).
        folder = str(Path(args.flow).resolve().parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (folder, os.environ.get("PYTHONPATH")) if p)

    def run_one(name: str, seed: int, say) -> dict:
        rate = args.rate or (guarded_drills.RATE if name in GUARDED or ledger else 1000.0)
        return run_drill(name, seed=seed, messages=args.messages, flow_text=flow_text, rate=rate,
                         say=say, wait_replicas=args.wait_replicas, samples=samples, books_in_ledger=ledger)
    return drill_series(args, runnable, run_one, lambda name, seed: f"twinflow drill {name} --seed {seed} "
                                                                     f"--messages {args.messages}",
                        not_applicable=skipped)


def print_not_applicable(args, skipped: dict[str, str]) -> None:
    """A line per drill left out and its reason: ``--json``, an object with ``not_applicable``."""
    for name, why in skipped.items():
        print(json.dumps({"drill": name, "not_applicable": why}) if args.json else f"{name}: not applicable: {why}",
              flush=True)


def cmd_host_drill(args) -> int:
    """``twinflow drill NAME --hosts``: each drill's runs on a full lab of their own (chaos/host_drills.py)."""
    if os.geteuid() != 0:
        print(f"twinflow: twinflow drill --hosts needs root: it makes a lab of network namespaces "
              f"(this process runs as uid {os.geteuid()})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    from twinflow.chaos.guide_drills import GUIDE_DRILLS, GuideDrillRunner
    from twinflow.chaos.host_drills import HOST_DRILLS, HostDrillRunner

    # `all`: the drills on the full lab; `guide-all`: the deployment guide's, on a lab it builds;
    # or names separated by commas, of one of the two (a guide series shares one lab).
    names = {"all": list(HOST_DRILLS), "guide-all": list(GUIDE_DRILLS)}.get(args.name, args.name.split(","))
    if not (set(names) <= set(HOST_DRILLS) or set(names) <= set(GUIDE_DRILLS)):
        print(f"twinflow: unknown drill between hosts {args.name!r} (known: all, {', '.join(HOST_DRILLS)}; "
              f"guide-all, {', '.join(GUIDE_DRILLS)})", file=sys.stderr)
        return EXIT_BAD_FLOW

    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    runner_of = GuideDrillRunner if names[0] in GUIDE_DRILLS else HostDrillRunner
    runner = runner_of(args.messages, args.rate, say=say)
    try:
        # Drill by drill (each drill's runs on one lab), not round by round.
        rerun = lambda name, seed: f"twinflow drill {name} --hosts --seed {seed} --messages {args.messages}"  # noqa: E731
        return drill_series(args, names, lambda name, seed, say: runner.run(name, seed), rerun, by_drill=True)
    finally:
        runner.close()


def drill_series(args, names: list[str], run_one, rerun, by_drill: bool = False,
                 not_applicable: dict[str, str] | None = None) -> int:
    """Run ``names`` ``args.runs`` times each (``run_one(name, seed, say)`` -> result), round by
    round so a stopped series covers every drill (``by_drill``: a drill's runs one after another);
    print each result (``--json``: a line each), then the table and, when asked, the report.
    ``not_applicable``: drill -> why it does not apply to the flow; each is said once (``--json``: a
    line first), never run and left out of the exit status. 0 when every run passed."""
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    skipped = dict(not_applicable or {})
    if args.json:
        print_not_applicable(args, skipped)
    for name, why in skipped.items():
        say(f"drill {name}: not applicable: {why}")
    results = []
    seeds = range(args.seed, args.seed + args.runs)
    plan = [(seed, name) for name in names for seed in seeds] if by_drill else [
        (seed, name) for seed in seeds for name in names]
    for i, (seed, name) in enumerate(plan, 1):
        say(f"[{i}/{len(plan)}] drill {name} (seed {seed}, {args.messages} messages)...")
        try:
            result = run_one(name, seed, say)
        except Exception as exc:  # the drill could not run to its check: a failure, with its reason
            result = {"drill": name, "seed": seed, "messages": args.messages, "lost": None, "duplicated": None,
                      "out_of_order": None, "rto_s": None, "passed": False, "rerun": rerun(name, seed),
                      "error": f"{type(exc).__name__}: {exc}"[:2000]}
        results.append(result)
        if args.json:
            # The IDs a failed run lost or doubled (the first 20), only when there are some.
            keys = DRILL_KEYS + [k for k in DRILL_EXTRA_KEYS if k in result and (result[k] or not k.endswith("_ids"))]
            print(json.dumps({k: result.get(k) for k in keys}), flush=True)
        else:
            say(f"  {'passed' if result['passed'] else 'FAILED'}: lost {result['lost']}, duplicated "
                f"{result['duplicated']}, rto {result['rto_s']} s" + (f"; {result['error']}" if "error" in result else ""))
            if not result["passed"]:
                say(f"  rerun: {result['rerun']}")
    if not args.json:
        print(_table(DRILL_COLUMNS, [[r.get(c) for c in DRILL_COLUMNS] for r in results]))
        print_not_applicable(args, skipped)
    report_dir = args.report or ("drill-report" if args.name == "all" else None)
    if report_dir:
        from twinflow.chaos.report import write_report

        say(f"report: {write_report(results, Path(report_dir), DRILL_COLUMNS, not_applicable=skipped)}")
    return 0 if all(r["passed"] for r in results) else 1


# -- simulate ----------------------------------------------------------------
def cmd_simulate(args) -> int:
    _need_extra("chaos", "fakeredis", "lupa")
    from twinflow.chaos.sim.simulator import run_once, simulate

    flow_text, samples = None, None
    if args.flow:
        graph = _load_flow(args.flow)
        flow_text = Path(args.flow).read_text()
        samples = _flow_messages(args, graph)
    elif args.samples:
        print("twinflow: --samples goes with --flow (the built-in kinds have messages of their own)", file=sys.stderr)
        return EXIT_BAD_FLOW
    kind = None if args.flow else args.kind
    wait = not args.no_wait
    rerun = f"twinflow simulate --seed {{seed}} --runs 1 --steps {args.steps} --messages {args.messages}" + (
        f" --flow {args.flow}" if args.flow else f" --kind {args.kind}") + (
        f" --samples {args.samples}" if args.samples else "") + ("" if wait else " --no-wait")
    if args.runs == 1:  # one seed: its whole trace on request
        r = run_once(args.seed, args.steps, args.messages, flow_text, verbose=args.verbose, kind=kind, wait=wait,
                     samples=samples)
        if args.trace or not r.passed:
            print("\n".join(r.trace), file=sys.stderr)
        out = {"runs": 1, "failed": int(not r.passed), **r.summary()}
        print(json.dumps(out) if args.json else _simulate_text(out, [r], rerun))
        return 0 if r.passed else 1
    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    out = simulate(args.seed, args.runs, args.steps, args.messages, flow_text, jobs=args.jobs, say=say,
                   kind=kind, wait=wait, samples=samples)
    failures = out.pop("failures")
    with_expected = out.pop("with_expected", [])
    for r in failures:
        print("\n".join(r.trace[-args.trace_lines:]), file=sys.stderr)
    if args.json:
        print(json.dumps({**out, "failed_seeds": [r.seed for r in failures],
                          "expected": [f"seed {r.seed}: {p}" for r in with_expected for p in r.expected[:2]],
                          "problems": [p for r in failures for p in r.problems[:3]]}))
    else:
        print(_simulate_text(out, failures, rerun))
        if out.get("counts"):
            print("counts: " + ", ".join(f"{k} {v}" for k, v in out["counts"].items()))
        for r in with_expected[:5]:
            print(f"seed {r.seed} (no WAIT), what its failovers cost: " + "; ".join(r.expected[:2]))
    return 0 if not failures else 1


def _flow_messages(args, graph) -> list[dict] | None:
    """The ``--samples`` of a ``--flow`` run, read; exits EXIT_BAD_FLOW, in one line naming the
    field, when the flow's messages can be neither made up nor made from the samples
    (twinflow/testing/flow_messages.py)."""
    from twinflow.testing.flow_messages import SAMPLES_HINT, CannotGenerate, SamplesError, messages_for, read_samples

    try:
        samples = read_samples(args.samples) if args.samples else None
        messages_for(graph, samples)
    except CannotGenerate as exc:
        print(f"twinflow: cannot make up messages for {args.flow}: {exc}; {SAMPLES_HINT}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_FLOW) from None
    except SamplesError as exc:
        print(f"twinflow: --samples refused: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_FLOW) from None
    return samples


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
    from twinflow.cluster.batch_phases import PHASES
    from twinflow_dev.flow_bench import Load, flow_vs_passthrough

    say = (lambda text: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))
    out = flow_vs_passthrough(Load(args.messages, args.rate, args.seconds, args.rounds, args.batch_size), say)
    if args.json:
        print(json.dumps(out))
        return 0
    fig = out["summary"]

    def cell(key: str) -> str:
        f = fig.get(key)
        return "" if f is None else f"{f['median']:,} ({f['min']:,}-{f['max']:,})"

    print(_table([f"median (min-max) of {out['rounds']} rounds", "two bare Spark readers", "twinflow pair (chained flow)",
                  "pair / bare"], [
        [f"burst of {out['messages']:,}, msg/s", cell("two_msgs_per_s"), cell("pair_msgs_per_s"), cell("ratio_two")],
        ["CPU µs per message, Redis included", cell("two_cpu_us_per_msg"), cell("pair_cpu_us_per_msg"),
         cell("cpu_ratio")],
        [f"latency p50 at {out['rate']:.0f} msg/s, ms", cell("bare_p50_ms"), cell("pair_p50_ms"), cell("p50_ratio")],
        [f"latency p99 at {out['rate']:.0f} msg/s, ms", cell("bare_p99_ms"), cell("pair_p99_ms"), ""],
    ]))
    for when, b in out["breakdown"].items():
        if b.get("batches"):
            print(f"\nthe master's batches ({when}: {b['batches']}, {b['entries_p50']:,} entries at p50), ms:")
            print(_table(["phase", "p50", "p99", "share of the batch thread"],
                         [[p, b[p]["p50_ms"], b[p]["p99_ms"], b[p].get("share", "")] for p in PHASES]))
    print()
    print(_table(["target", "median", "met"], [[f"{k} {t['target']}", t["median"], "yes" if t["met"] else "no"]
                                              for k, t in out["targets"].items()]))
    return 0


# -- demo --------------------------------------------------------------------
def cmd_certs(args) -> int:
    from twinflow.certs import CertsError, make_certs

    if not args.peer:  # not argparse's required=: --node (the same flag) may give it
        print("twinflow certs: the following arguments are required: --peer", file=sys.stderr)
        return 2
    try:
        made = make_certs(args.dir, args.peer, args.name or [args.peer], days=args.days, ca_days=args.ca_days)
    except CertsError as exc:
        print(f"twinflow certs: {exc}", file=sys.stderr)
        return 2
    for path in made:
        print(path)
    for warning in made.warnings:
        print(f"twinflow certs: warning: {warning}", file=sys.stderr)
    from twinflow.certs import days_left

    print(f"twinflow: {args.peer}.pem ends in {days_left(Path(args.dir) / f'{args.peer}.pem')} days, the CA in "
          f"{days_left(Path(args.dir) / 'ca.pem')} days", file=sys.stderr)
    print(f"twinflow: {len(made)} files made in {args.dir}; name them in the flow file's security section "
          f"(docs/operations/security.md)", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    from twinflow_dev.demo import run_demo

    result = run_demo(messages=args.messages, rate=args.rate, kill_at=args.kill_at,
                      progress=not args.json, keep=args.keep, flow=args.flow, console=args.console)
    if args.json:
        print(json.dumps(result))
    return 0 if result["lost"] == 0 and result["duplicated"] == 0 else 1
