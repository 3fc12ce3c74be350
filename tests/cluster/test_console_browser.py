"""The operator console in a real browser, against a live two-peer cluster.

Two ``twinflow run`` processes on the session's redis-server and ZooKeeper, a
``twinflow console`` process with a read token and an admin token, and Debian's headless
Chromium driven by Selenium (``tests/browser.py``). One story, as an operator lives it:
both peers appear with their roles; the counts move while messages flow; a read-only
operator sees the failed messages but cannot resubmit them (no button, and the console
refuses the call); an admin resubmits one from the page, with a confirmation, and it is
delivered once; a handover asked from the page moves the master role; after a SIGKILL of
the master the killed peer shows as silent, and the new master and the failover with its
six phases appear within seconds. The flow is ``test_failed_audit``'s: the claim pair,
whose action's service refuses a message with ``fail`` while the file ``broken`` exists.
Screenshots of each stage are saved (``TWINFLOW_CONSOLE_SHOTS=DIR`` copies them there).
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from collections import Counter

import pytest

from tests.browser import chromium, fetch, shots, text_of, texts_of
from tests.cluster.harness import cluster_on
from tests.cluster.test_failed_audit import FLOW, HANDLERS  # the claim pair whose action's service may refuse
from tests.conftest import wait_until
from twinflow.client import Client

pytestmark = pytest.mark.cluster


def start_console(tmp_path, c) -> tuple[subprocess.Popen, str]:
    """``twinflow console`` on a free loopback port with read and admin tokens; (process, URL)."""
    (tmp_path / "read.token").write_text("read-token-for-the-console\n")
    (tmp_path / "admin.token").write_text("admin-token-for-the-console\n")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "drills.jsonl").write_text(json.dumps({"drill": "kill-master", "seed": 1, "messages": 2000, "lost": 0,
                                                      "duplicated": 0, "rto_s": 2.1, "passed": True}) + "\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "twinflow.cli", "console", str(c.flow_path), "--redis", c.redis_url,
         "--listen", "127.0.0.1:0", "--reports", str(reports),
         "--token", f"read=file:{tmp_path / 'read.token'}", "--token", f"admin=file:{tmp_path / 'admin.token'}"],
        stdout=subprocess.PIPE, stderr=open(tmp_path / "console.log", "w"), text=True, cwd=tmp_path)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    assert " at http://127.0.0.1:" in line, (line, (tmp_path / "console.log").read_text())
    return proc, line.rsplit(" at ", 1)[1].strip()


def sign_in(driver, url: str, name: str, token: str) -> None:
    driver.get(url)
    driver.execute_script("sessionStorage.clear()")  # signed out: the page asks again
    driver.refresh()
    wait_until(lambda: driver.execute_script("return !document.querySelector('#sign-in').hidden"), 10,
               what="the sign-in form")
    driver.find_element("id", "sign-in-name").send_keys(name)
    driver.find_element("id", "sign-in-token").send_keys(token)
    driver.find_element("id", "sign-in-submit").click()
    wait_until(lambda: driver.execute_script("return !document.querySelector('#panels').hidden"), 10,
               what=f"the panels for {name}")


def roles(driver) -> dict[str, str]:
    return driver.execute_script(
        "return Object.fromEntries([...document.querySelectorAll('#peers tbody tr')]"
        ".map(r => [r.dataset.peer, r.querySelector('.role').textContent]))")


def test_the_console_shows_the_cluster_live_and_acts_for_an_admin_only(services, tmp_path, flow_name):
    (tmp_path / "handlers.py").write_text(HANDLERS)
    (tmp_path / "broken").touch()
    calls = tmp_path / "calls.log"
    save = shots(tmp_path / "screens")

    def called() -> Counter:
        return Counter(calls.read_text().split()) if calls.exists() else Counter()

    c = cluster_on(services, tmp_path, flow_name, text=FLOW)
    console = None
    try:
        c.peer("a")
        c.wait_status("a", role="master", streaming=1)
        c.peer("b", extra=["--worker-read-behind-ms", "0"])
        c.wait_status("b", role="worker", streaming=1)
        console, url = start_console(tmp_path, c)
        with chromium(1400, 1500) as driver:
            # A read-only operator: both peers with their roles.
            sign_in(driver, url, "rita", "read-token-for-the-console")
            wait_until(lambda: roles(driver) == {"a": "master", "b": "worker"}, 15,
                       what=f"both peers on the page: {roles(driver)}")
            assert "read only" in text_of(driver, "#who")

            # Counts move while messages flow.
            sent = 0

            def publish(n: int, **extra) -> None:
                nonlocal sent
                with Client(c.live_address(), flow_name) as client:
                    client.publish([{"id": f"m{sent + k}", "seq": sent + k, **extra} for k in range(n)])
                sent += n

            publish(20)
            count = '[data-outlink="deliver.done"] .count'
            wait_until(lambda: text_of(driver, count) == "20", 20, what=f"20 delivered: {text_of(driver, count)}")
            publish(30)
            wait_until(lambda: text_of(driver, count) == "50", 20, what=f"50 delivered: {text_of(driver, count)}")
            assert text_of(driver, '[data-outlink="deliver.done"] .rate').strip() != "0.0/s"
            save(driver, "console-live")

            # Two failed messages: the reader sees them, has no resubmit button, and is refused.
            with Client(c.live_address(), flow_name) as client:
                client.publish([{"id": "bad-1", "seq": 1000, "fail": True}, {"id": "bad-2", "seq": 1001, "fail": True}])
            failed_rows = "#failures tbody tr[data-status=FAILED]"
            wait_until(lambda: len(texts_of(driver, failed_rows)) == 2, 30,
                       what=f"two failed messages listed: {texts_of(driver, '#failures tbody tr')}")
            assert driver.execute_script("return document.querySelector('#resubmit').hidden")
            refs = driver.execute_script(f"return [...document.querySelectorAll('{failed_rows}')].map(r => r.dataset.ref)")
            refused = fetch(driver, "/console/api/resubmit", "POST", json.dumps({"refs": refs[:1]}), action=True)
            assert refused["status"] == 403 and "admin token" in refused["body"], refused
            save(driver, "console-read-only")

            # An admin resubmits one from the page, confirmed; it runs once more and is delivered once.
            sign_in(driver, url, "alice", "admin-token-for-the-console")
            wait_until(lambda: len(texts_of(driver, failed_rows)) == 2, 15, what="the failed messages for alice")
            (tmp_path / "broken").unlink()  # the service is fixed
            driver.find_element("css selector", '#failures tr[data-id="bad-1"] .pick').click()
            driver.find_element("id", "resubmit").click()
            wait_until(lambda: driver.execute_script("return !document.querySelector('#confirm').hidden"), 5,
                       what="the confirmation")
            save(driver, "console-resubmit")
            driver.find_element("id", "confirm-yes").click()
            wait_until(lambda: "1 resubmitted" in (text_of(driver, "#action-result") or ""), 15,
                       what=f"the resubmit's answer: {text_of(driver, '#action-result')}")
            wait_until(lambda: called()["bad-1"] == 2, 60, what="bad-1 to run once more")
            wait_until(lambda: sum(f[b"id"] == b"bad-1" for _, f in c.redis.xrange(c.sink_key)) == 1, 30,
                       what="bad-1 delivered")
            assert called()["bad-2"] == 1  # not selected: not resubmitted
            shown = json.loads(fetch(driver, f"/console/api/failures/{refs[0]}")["body"])
            assert shown["mark"]["status"] == "RESUBMITTED" and shown["mark"]["by"].startswith("alice (token ")

            # A handover asked from the page; then the new master is killed.
            driver.find_element("id", "handover").click()
            wait_until(lambda: driver.execute_script("return !document.querySelector('#confirm').hidden"), 5,
                       what="the handover's confirmation")
            driver.find_element("id", "confirm-yes").click()
            wait_until(lambda: roles(driver) == {"a": "worker", "b": "master"}, 30,
                       what=f"b master after the handover: {roles(driver)}")
            epoch = int(text_of(driver, '#peers tr[data-peer="b"] .epoch'))
            publish(10)
            killed = time.monotonic()
            c.peers["b"].kill()
            wait_until(lambda: roles(driver).get("a") == "master", 30, what=f"a master again: {roles(driver)}")
            publish(10)  # the new master's first write is its first step with messages
            # The killed master's last status lingers until its TTL: it shows as silent, not as a master.
            silent_or_gone = "const r = document.querySelector('#peers tr[data-peer=\"b\"]'); return !r || r.classList.contains('silent')"
            wait_until(lambda: driver.execute_script(silent_or_gone), 10, what="b silent or gone")
            assert text_of(driver, "#master") == "a"
            new = f'.failover[data-epoch="{epoch + 1}"]'
            recorded = f"return [...document.querySelectorAll('{new} .phase')].filter(p => p.dataset.at !== '').length"
            wait_until(lambda: driver.execute_script(recorded) == 6, 30,
                       what=f"the failover's six phases: {texts_of(driver, new + ' .phase')}")
            seen_s = time.monotonic() - killed
            phases = texts_of(driver, f"{new} .phase .phase-name")
            assert phases == ["master lost", "session expired", "promoted", "state loaded", "rolled back",
                              "first write"], phases
            assert seen_s < 20, f"the failover took {seen_s:.1f} s to show"
            causes = driver.execute_script("return Object.fromEntries([...document.querySelectorAll('.failover')]"
                                           ".map(f => [f.dataset.epoch, f.dataset.cause]))")
            assert causes == {str(epoch + 1): "failover", str(epoch): "handover", "1": "start"}, causes
            wait_until(lambda: text_of(driver, count) == "71", 30, what=f"71 delivered: {text_of(driver, count)}")
            assert "kill-master" in text_of(driver, "#drills")
            save(driver, "console-failover")
    finally:
        if console is not None:
            console.terminate()
            console.wait(10)
        c.stop()
