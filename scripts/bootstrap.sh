#!/usr/bin/env bash
# Installs what twinflow needs on a fresh Debian 12 machine, idempotently:
# Debian's redis-server, zookeeper, nftables, iproute2, prometheus (for its promtool), chromium
# with chromium-driver (the console's browser tests) and a JDK's javac (openjdk-17-jdk-headless), each
# only when absent, a virtual environment at .venv/ and the package with its test extras (only when
# pyproject.toml changed since the last install).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v redis-server >/dev/null 2>&1 || need_apt+=(redis-server)
[ -f /usr/share/java/zookeeper.jar ] || need_apt+=(zookeeper)
# The kernel-fault drill (zk-drop-master): nftables rules in a network namespace of its own.
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need_apt+=(nftables)
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || need_apt+=(iproute2)
# The alerting rules' checks (tests/test_alert_rules.py): promtool, which Debian ships in prometheus.
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
# The console's browser tests (tests/cluster/test_console_browser.py): Debian's headless Chromium and
# its driver, the same version (no browser download at test time).
[ -x /usr/bin/chromedriver ] || need_apt+=(chromium chromium-driver)
# A JDK's javac: `make test` builds the jar of runtime/spark/local_fs.py with it, and its tests need it.
command -v javac >/dev/null 2>&1 || need_apt+=(openjdk-17-jdk-headless)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "bootstrap: installing ${need_apt[*]} with apt" >&2
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    if [[ " ${need_apt[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
        # Only promtool is wanted: the Prometheus server the package enables is stopped and disabled.
        $sudo_cmd systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
fi
command -v java >/dev/null 2>&1 || { echo "bootstrap: Java 17 is required (apt-get install openjdk-17-jre-headless)" >&2; exit 1; }

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
    echo "bootstrap: creating .venv with $PY" >&2
    "$PY" -m venv .venv
fi
stamp=.venv/.twinflow-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "bootstrap: installing twinflow and its test extras into .venv (log: .venv/pip.log)" >&2
    if ! { .venv/bin/python -m pip install -q --upgrade pip &&
           .venv/bin/python -m pip install -q -e '.[test]'; } >.venv/pip.log 2>&1; then
        tail -40 .venv/pip.log >&2
        echo "bootstrap: pip install failed (full log: .venv/pip.log)" >&2
        exit 1
    fi
    .venv/bin/python -c 'import twinflow.cli, pyspark, redis, kazoo, grpc'
    touch "$stamp"
fi
