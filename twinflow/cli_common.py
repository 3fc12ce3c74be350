"""What the ``twinflow`` commands share: addresses from flags, the environment or the local
services, flow files, Spark and gRPC settings, tables, and the exit codes.

A command that calls the peers over gRPC as an operator (``status``, ``handover``)
adds its options with :func:`operator_security_flags` and turns them into a
``GrpcSecurity`` with :func:`_grpc_security`: the operator's own client certificate and
key, the CA, the server name and tokens, each from its flag, else its ``TWINFLOW_*``
variable (:data:`OPERATOR_ENV`), else the flow file's ``security`` section. A command
that only reads (``status``, ``failures list`` and ``show``) sends one token, the least
that suffices: the read token when one is named, else the admin token
(:func:`_reading_scope`). :func:`_grpc_failure` says in one line why such a call failed.

Under failure: a flow file that cannot be read or parsed ends the command with
``EXIT_BAD_FLOW`` and the field and reason on stderr, and so do gRPC settings that
cannot be used (a client certificate without its key, or the reverse; a TLS file that
cannot be read); a missing optional extra names the ``pip install`` that adds it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

from twinflow.services_state import SERVICES_STATE, RecordedServices

LAB_DIR = Path(".twinflow") / "lab"

START_FROM = ("processed", "beginning")  # where a peer with a new state dir may start (PeerConfig.start_from)

EXIT_BAD_FLOW = 2
EXIT_UNAVAILABLE = 3
EXIT_REFUSED = 4


def _local_services() -> RecordedServices | None:
    """The servers ``twinflow services up`` recorded, read from its state file alone."""
    return RecordedServices.load(SERVICES_STATE) if SERVICES_STATE.exists() else None


def _address(flag: str | None, env: str, kind: str) -> str:
    if flag:
        return flag
    if os.environ.get(env):
        return os.environ[env]
    svc = _local_services()
    address = None if svc is None else svc.redis_url if kind == "redis" else svc.zk_hosts
    if address:
        return address
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


def _spark_conf(pairs: list[str]) -> dict:
    conf = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.startswith("spark."):
            raise SystemExit(f"twinflow: --spark-conf {pair!r}: expected spark.KEY=VALUE")
        conf[key] = value
    return conf


# The operator options' variables: under a flag's name, read when the flag is not given.
OPERATOR_ENV = {
    "--tls-cert": "TWINFLOW_TLS_CERT",
    "--tls-key": "TWINFLOW_TLS_KEY",
    "--tls-ca": "TWINFLOW_TLS_CA",
    "--tls-server-name": "TWINFLOW_TLS_SERVER_NAME",
    "--token": "TWINFLOW_TOKEN",  # SCOPE=REF[,SCOPE=REF...]
}


def operator_security_flags(parser, scopes: tuple[str, ...] = ("admin",), reads: bool = False) -> None:
    """Add the gRPC options of a command that calls the peers as an operator to ``parser`` (an
    argparse parser or subparser): ``--tls-cert``/``--tls-key`` (the operator's client certificate,
    for peers with mutual TLS), ``--tls-ca``, ``--tls-server-name`` and ``--token``, each also read
    from its variable in :data:`OPERATOR_ENV`. :func:`_grpc_security` turns them into the settings,
    reading the tokens of ``scopes`` only (the services the command calls; the Admin service's by
    default), so that an operator needs no peer's escalation or ingest token. ``reads``: the
    command's Admin calls only read, so a read token stands in for the admin token
    (:func:`_reading_scope`)."""
    g = parser.add_argument_group(
        "gRPC security (each flag over its TWINFLOW_* variable, both over the flow file's security section)")
    g.add_argument("--tls-cert", metavar="PEM",
                   help="the operator's client certificate, signed by the CA the peers trust (for peers with "
                        "mutual TLS; needs --tls-key; env TWINFLOW_TLS_CERT)")
    g.add_argument("--tls-key", metavar="PEM", help="the client certificate's private key (env TWINFLOW_TLS_KEY)")
    g.add_argument("--tls-ca", metavar="PEM", help="the CA that signed the peers' certificates (env TWINFLOW_TLS_CA)")
    g.add_argument("--tls-server-name", metavar="NAME",
                   help="the name to check in a peer's certificate when it is not the host dialled "
                        "(env TWINFLOW_TLS_SERVER_NAME)")
    sent = " and ".join(scopes) + (" (or read)" if reads else "")
    g.add_argument("--token", action="append", metavar="SCOPE=REF",
                   help=f"the {sent} token this command sends, named as file:PATH or env:NAME "
                        f"(never the token itself), e.g. {scopes[0]}=file:PATH; repeatable (env TWINFLOW_TOKEN: "
                        f"SCOPE=REF, comma-separated)"
                        + ("; the calls that only read send the read token when one is given, else the admin "
                           "token" if reads else ""))
    parser.set_defaults(operator_scopes=tuple(scopes), operator_reads=reads)


def _token_refs(pairs: list[str], source: str) -> dict:
    refs = {}
    for pair in pairs:
        scope, eq, ref = pair.strip().partition("=")
        if not eq:  # the start only, as read_secret says it: it may be a token given as its value
            raise SystemExit(f"twinflow: {source}: expected SCOPE=file:PATH or SCOPE=env:NAME "
                             f"(got one starting {scope[:2]!r})")
        refs[scope.strip()] = ref.strip()
    return refs


def _refuse_settings(reason: str) -> NoReturn:
    print(f"twinflow: gRPC security settings refused: {reason}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_FLOW) from None


def _operator_settings(args) -> dict:
    """The client settings of an operator command: each flag, else its variable (None when neither
    says). A certificate and its key are one setting, taken whole from the flags or else whole from
    the environment; half a pair exits EXIT_BAD_FLOW naming what is missing."""
    env = {flag: os.environ.get(name) or None for flag, name in OPERATOR_ENV.items()}
    cert, key = args.tls_cert, args.tls_key
    if cert or key:
        if not (cert and key):
            given, missing = ("--tls-cert", "--tls-key") if cert else ("--tls-key", "--tls-cert")
            _refuse_settings(f"{given} needs {missing}: a client certificate and its private key go together")
    elif env["--tls-cert"] or env["--tls-key"]:
        cert, key = env["--tls-cert"], env["--tls-key"]
        if not (cert and key):
            given, missing = (("TWINFLOW_TLS_CERT", "TWINFLOW_TLS_KEY") if cert
                              else ("TWINFLOW_TLS_KEY", "TWINFLOW_TLS_CERT"))
            _refuse_settings(f"{given} is set but {missing} is not: a client certificate and its private key "
                             f"go together")
    refs = _token_refs([p for p in (env["--token"] or "").split(",") if p.strip()], "TWINFLOW_TOKEN")
    refs.update(_token_refs(args.token or [], "--token"))  # per scope, a flag over the variable
    return {"cert": cert, "key": key, "ca": args.tls_ca or env["--tls-ca"],
            "server_name": args.tls_server_name or env["--tls-server-name"], "token_refs": refs}


def _reading_scope(own: dict, spec) -> str:
    """The scope of the one token a command that only reads sends: the least that suffices. Read
    when the operator's own settings (flags, variables: ``own``) name a read token; else admin when
    they name an admin token; else read when the flow file's ``security`` section (``spec``) names
    one; else admin. The operator's settings decide before the flow file, so that an operator who
    names an admin token is never stopped by a read token file of the peers' it cannot open.

    >>> _reading_scope({"admin": "file:a", "read": "file:r"}, None), _reading_scope({"admin": "file:a"}, None)
    ('read', 'admin')
    """
    if "read" in own or "admin" in own:
        return "read" if "read" in own else "admin"
    return "read" if spec is not None and "read" in dict(spec.tokens) else "admin"


def _grpc_security(args, graph, reads: bool | None = None):
    """The flow file's ``security`` section with the command line's TLS and token settings over it
    (for an operator command, :func:`operator_security_flags`: with the ``TWINFLOW_*`` variables
    between the two, only its scopes' tokens, and its TLS files read now); exits EXIT_BAD_FLOW naming the file or setting
    that cannot be used (never a secret's value). ``reads`` (default: the parser's, see
    :func:`operator_security_flags`): the calls to come only read, so one token is read and sent,
    the read or the admin token (:func:`_reading_scope`)."""
    scopes = getattr(args, "operator_scopes", None)
    spec = graph.cluster.security if graph.cluster else None
    if scopes:
        settings = {**_operator_settings(args), "scopes": scopes}
        if getattr(args, "operator_reads", False) if reads is None else reads:
            chosen = _reading_scope(settings["token_refs"], spec)
            settings["scopes"] = tuple(chosen if scope == "admin" else scope for scope in scopes)
        # The gRPC core's own lines on a failed TLS handshake would come before the one that says why.
        os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    else:
        settings = {"cert": getattr(args, "tls_cert", None), "key": getattr(args, "tls_key", None),
                    "ca": args.tls_ca, "server_name": args.tls_server_name,
                    "token_refs": _token_refs(getattr(args, "token", None) or [], "--token")}
    from twinflow.grpc_security import SecurityConfigError, security_from
    from twinflow.secrets import SecretError

    try:
        security = security_from(spec, mutual=getattr(args, "tls_mutual", False),
                                 insecure=getattr(args, "insecure", False), **settings)
        if security.tls is not None and scopes:
            security.tls.channel_credentials()  # a file that cannot be read, named before any call
        return security
    except (SecurityConfigError, SecretError) as exc:
        _refuse_settings(str(exc))


def _grpc_failure(address: str, exc: Exception, security) -> str:
    """One line saying why a call to the peer at ``address`` failed: the gRPC status and its
    details, and what to set when a peer serving TLS closed the connection in the handshake."""
    code = getattr(exc, "code", None)
    if not callable(code):
        return f"twinflow: peer at {address} did not answer: {exc}"
    line = f"twinflow: peer at {address} did not answer: {code().name}: {exc.details()}"
    if code().name == "UNAVAILABLE" and "Socket closed" in (exc.details() or ""):
        tls = security.tls
        if tls is None:
            line += (" (a peer serving TLS closes a plain connection: pass --tls-ca, or set TWINFLOW_TLS_CA "
                     "or the flow file's security.tls)")
        elif not tls.cert:
            line += (" (a peer with mutual TLS closes the connection of a client without a certificate: pass "
                     "--tls-cert and --tls-key, or set TWINFLOW_TLS_CERT and TWINFLOW_TLS_KEY)")
        else:
            line += (" (a peer with mutual TLS closes the connection of a client whose certificate its CA "
                     "did not sign)")
    return line


def _table(header: list[str], rows: list[list]) -> str:
    cells = [header] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- drill -------------------------------------------------------------------
def _need_extra(extra: str, *modules: str) -> None:
    """Exit EXIT_UNAVAILABLE naming the extra to install when one of ``modules`` is missing: the
    chaos tools' dependencies are not a peer's (``pip install 'twinflow[chaos]'``)."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        print(f"twinflow: this command needs {', '.join(missing)}: pip install 'twinflow[{extra}]'", file=sys.stderr)
        raise SystemExit(EXIT_UNAVAILABLE)
