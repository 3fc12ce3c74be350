"""The shipped unit file, read as systemd would read it (twinflow_dev/systemd_unit.py)."""

from pathlib import Path

import pytest

from twinflow.cli import build_parser
from twinflow_dev.systemd_unit import ServiceUnit, UnitError, read_environment_file

DEPLOY = Path(__file__).parents[1] / "deploy" / "systemd"


def test_the_shipped_unit_runs_twinflow_run_with_every_setting_of_the_example_env_file():
    unit = ServiceUnit.read(DEPLOY / "twinflow-peer@.service")
    assert unit.env_file_paths("peer-a") == ["/etc/twinflow/peer-a.env"]
    env = read_environment_file(DEPLOY / "peer.env.example")
    argv = unit.start_argv("peer-a", env)
    assert argv[:2] == ["/usr/bin/env", "twinflow"]
    args = build_parser().parse_args(argv[2:])  # what the CLI would take, flag for flag
    assert (args.command, args.peer_id, args.flow) == ("run", "peer-a", "/etc/twinflow/flow.yaml")
    assert (args.listen, args.advertise) == ("0.0.0.0:7070", "host-a.example:7070")
    assert args.tls_cert == "/etc/twinflow/tls/peer-a.pem" and args.tls_mutual
    assert sorted(t.split("=")[0] for t in args.token) == ["admin", "escalation", "ingest"]
    assert unit.stop_argv("peer-a", env, main_pid=77) == ["/bin/kill", "-TERM", "77"]
    assert (unit.kill_signal, unit.timeout_stop_s) == ("SIGTERM", 30.0)


def test_a_variable_that_is_not_set_is_refused_not_left_in_the_command():
    unit = ServiceUnit.parse("[Service]\nExecStart=/bin/echo ${MISSING}\n")
    with pytest.raises(UnitError, match=r"\$MISSING is not set"):
        unit.start_argv("x", {})


def test_what_the_lab_cannot_run_as_systemd_would_is_refused():
    with pytest.raises(UnitError, match="no ExecStart"):
        ServiceUnit.parse("[Unit]\nDescription=x\n")
    with pytest.raises(UnitError, match="prefixes are not supported"):
        ServiceUnit.parse("[Service]\nExecStart=-/bin/true\n")
    with pytest.raises(UnitError, match="several ExecStart"):
        ServiceUnit.parse("[Service]\nExecStart=/bin/true\nExecStart=/bin/false\n")
