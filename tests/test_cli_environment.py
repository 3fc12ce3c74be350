"""One set of variables: what a peer's environment file sets is what every twinflow command reads
(deploy/systemd/peer.env.example), so an operator who loads it reaches the same servers."""

from __future__ import annotations

from tests.test_systemd_unit import DEPLOY
from twinflow.cli import build_parser
from twinflow_dev.systemd_unit import read_environment_file


def test_the_peer_environment_names_its_servers_with_the_variables_the_commands_read():
    env = read_environment_file(DEPLOY / "peer.env.example")
    for name in ("TWINFLOW_REDIS", "TWINFLOW_ZK", "TWINFLOW_SPARK_MASTER", "TWINFLOW_START_FROM",
                 "TWINFLOW_REDIS_PASSWORD", "TWINFLOW_ZK_AUTH"):
        assert name in env, name
    assert not {"REDIS", "ZK", "SPARK_MASTER"} & set(env)  # names no command reads
    unit = (DEPLOY / "twinflow-peer@.service").read_text()
    assert "--redis" not in unit and "--zk" not in unit and "--start-from" not in unit


def parse_run(monkeypatch, start_from: str | None):
    if start_from is None:
        monkeypatch.delenv("TWINFLOW_START_FROM", raising=False)
    else:
        monkeypatch.setenv("TWINFLOW_START_FROM", start_from)
    return build_parser().parse_args(["run", "flow.yaml", "--peer-id", "a"])  # defaults read when it is built


def test_run_takes_where_a_new_state_dir_starts_from_the_environment(monkeypatch):
    assert parse_run(monkeypatch, "processed").start_from == "processed"
    assert parse_run(monkeypatch, None).start_from is None


def test_a_start_from_variable_that_is_no_choice_is_refused_before_anything_starts(monkeypatch, capsys):
    from twinflow.cli_peer import cmd_run

    args = parse_run(monkeypatch, "middle")
    assert cmd_run(args) == 2
    assert "TWINFLOW_START_FROM='middle': must be one of processed, beginning" in capsys.readouterr().err


def test_the_environment_file_loads_in_sh_as_the_guide_loads_it(tmp_path):
    # `set -a; . /etc/twinflow/peer-a.env; set +a` (docs/operations/deploy.md): every value whole, no error.
    import subprocess

    example = DEPLOY / "peer.env.example"
    env = read_environment_file(example)
    script = f"set -a; . {example}; set +a; " + "; ".join(f'printf "%s\\n" "${name}"' for name in env)
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=10, cwd=tmp_path)
    assert (out.returncode, out.stderr) == (0, "")
    assert dict(zip(env, out.stdout.splitlines())) == env


def test_status_waits_for_a_peer_to_stream_and_gives_up_at_its_deadline(redis_url, tmp_path, flow_name, capsys):
    import json

    import redis

    from twinflow.testing.messages import CHAINED
    from twinflow.cluster.on_cluster import flow_keys
    from twinflow.runtime.flowgraph import load_graph

    flow = tmp_path / "flow.yaml"
    flow.write_text(CHAINED.read_text().replace("flow: orders", f"flow: {flow_name}", 1))
    keys = flow_keys(load_graph(flow))

    def status(timeout_s: str) -> tuple[int, str, str]:
        args = build_parser().parse_args(["status", str(flow), "--redis", redis_url, "--json",
                                          "--wait-streaming", "peer-x", "--wait-timeout", timeout_s])
        code = args.fn(args)
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = status("0.3")  # no such peer yet
    assert (code, out) == (1, "") and f"peer peer-x of flow {flow_name} did not stream within 0.3 s" in err
    r = redis.Redis.from_url(redis_url)
    r.sadd(keys.peers, "peer-x")
    r.hset(keys.peer("peer-x"), mapping={"peer_id": "peer-x", "role": "worker", "streaming": "0"})
    assert status("0.3")[0] == 1  # there, not streaming: still waiting
    r.hset(keys.peer("peer-x"), "streaming", "1")
    code, out, _ = status("5")
    assert code == 0 and [row["peer_id"] for row in json.loads(out)["peers"]] == ["peer-x"]
