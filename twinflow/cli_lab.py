"""``twinflow lab up|status|down``: a lab of hosts on this machine, each a network namespace with
its own address on one private bridge (:mod:`twinflow_dev.lab`; with ``--guide``, the
deployment guide's three machines, :mod:`twinflow_dev.guide_lab`).

Under failure: not root, or no usable ``ip netns``, ends the command with ``EXIT_UNAVAILABLE``
and what is missing on stderr, before anything is made; a lab that cannot be made is removed
again (its logs stay in the directory) and the command ends with status 1 and the failing
server's log tail; SIGTERM or Ctrl-C during ``up`` removes what was made too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from twinflow.cli_common import EXIT_UNAVAILABLE, _table

STATUS_COLUMNS = ["host", "address", "process", "port", "pid", "alive", "answers", "role", "epoch"]


def cmd_lab(args) -> int:
    if os.geteuid() != 0:
        print(f"twinflow: twinflow lab {args.action} needs root: it makes and enters network namespaces "
              f"(this process runs as uid {os.geteuid()})", file=sys.stderr)
        return EXIT_UNAVAILABLE
    from twinflow_dev.guide_lab import GUIDE_PREFIX, GuideLab
    from twinflow_dev.lab import STATE_FILE, Lab, LabError
    from twinflow_dev.lab_network import DEFAULT_PREFIX, LabNetError, LabState, LabUnavailable

    say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    if args.action == "up":
        try:
            if args.guide:
                lab = GuideLab(args.dir, prefix=args.prefix or GUIDE_PREFIX).up(say)
            else:
                lab = Lab(args.dir, short=args.short, prefix=args.prefix or DEFAULT_PREFIX).up(say)
        except LabUnavailable as exc:
            print(f"twinflow: {exc}", file=sys.stderr)
            return EXIT_UNAVAILABLE
        except (LabError, LabNetError, ValueError) as exc:
            print(f"twinflow: the lab could not be made: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 130
        print(_status_table(lab.status()))
        print(f"lab up in {lab.state.info['up_s']} s ({lab.state.info['form']} form); state {lab.state_path}")
        return 0
    try:
        guide = LabState.load(Path(args.dir) / STATE_FILE).info.get("form") == "guide"
        lab = GuideLab.load(args.dir) if guide else Lab.load(args.dir)
    except FileNotFoundError:
        print(f"no lab recorded in {args.dir} (twinflow lab up makes one)")
        return 0 if args.action == "down" else 1
    if args.action == "console":
        return _console(lab, args)
    if args.action == "status":
        rows = lab.status()
        print(_status_table(rows))
        # Every process alive, and every server answering (a client has nothing to answer: None).
        return 0 if all(r["alive"] and r["answers"] is not False for r in rows) else 1
    for line in lab.down():
        print(line)
    print(f"lab down ({args.dir})")
    return 0


def _status_table(rows: list[dict]) -> str:
    shown = {True: "yes", False: "no", None: "-"}
    return _table(STATUS_COLUMNS, [[shown[r[c]] if r[c] is None or isinstance(r[c], bool) else r[c]
                                    for c in STATUS_COLUMNS] for r in rows])


def _console(lab, args) -> int:
    """Forward ``--listen`` to the console of ``--peer`` until Ctrl-C (the guide lab has none)."""
    import threading

    from twinflow.cluster.metrics import split_address

    if lab.state.info.get("form") == "guide":
        print("twinflow: the guide lab's peers serve no console (the guide does not set one up)", file=sys.stderr)
        return 1
    host, port = split_address(args.listen)
    forward = lab.console(args.peer, listen=(host, port))
    secrets = Path(args.dir) / "secrets"
    print(f"the console of {args.peer}: https://localhost:{forward.port}/console/\n"
          f"  its certificate is signed by the lab's CA, {secrets / 'ca.pem'} (trust it, or accept the warning)\n"
          f"  sign in with the admin token in {secrets / 'admin.token'}; Ctrl-C stops the forward", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    forward.stop()
    return 0
