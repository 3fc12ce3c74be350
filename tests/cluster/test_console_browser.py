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

A second story needs no peer running: hostile values written into the flow's Redis by hand
(markup and script in failed messages, peer statuses, suspension entries, events and drill
reports; values that are not what a peer writes) are shown as the text they are, nothing of
them runs, and a bad value spoils at most its own row or panel, never the page.
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
from twinflow.cluster.on_cluster import flow_keys
from twinflow.runtime.store.flow_events import entry_fields
from twinflow.runtime.store.flow_store import FlowStore

pytestmark = pytest.mark.cluster


KILL_MASTER = {"drill": "kill-master", "seed": 1, "messages": 2000, "lost": 0, "duplicated": 0, "rto_s": 2.1,
               "passed": True}


def start_console(tmp_path, c, drills: tuple[dict, ...] = (KILL_MASTER,)) -> tuple[subprocess.Popen, str]:
    """``twinflow console`` on a free loopback port with read and admin tokens, ``drills`` in its
    reports; (process, URL)."""
    (tmp_path / "read.token").write_text("read-token-for-the-console\n")
    (tmp_path / "admin.token").write_text("admin-token-for-the-console\n")
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "drills.jsonl").write_text("".join(json.dumps(d) + "\n" for d in drills))
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


# Markup and script as they would come from a publisher, a hand-edited key or a report file.
HOSTILE = ('<img src=x onerror="window.__pwned=1">', '</script><script>window.__pwned=2</script>',
           '"><svg onload="window.__pwned=3">', "javascript:window.__pwned=4")


def test_hostile_values_are_shown_as_text_and_one_bad_value_spoils_no_more_than_its_place(
        services, tmp_path, flow_name):
    img, script, svg, link = HOSTILE
    (tmp_path / "handlers.py").write_text(HANDLERS)
    c = cluster_on(services, tmp_path, flow_name, text=FLOW)
    keys = flow_keys(c.graph)
    r = c.redis
    now, _ = r.time()
    live = now + 600  # a status no peer refreshes: dated ahead so that it is not shown silent meanwhile
    # Peer statuses: one as a peer writes it, one hostile in every text, one with malformed mappings.
    FlowStore(r, keys, "good").write_status({"peer_id": "good", "role": "master", "epoch": 3, "at": live,
                                             "grpc_address": "127.0.0.1:7001", "links": {}})
    FlowStore(r, keys, img).write_status({"peer_id": img, "role": script, "epoch": svg, "at": live,
                                          "grpc_address": svg, "version": link, "suspended": {img: {"reason": img}}})
    FlowStore(r, keys, "broken").write_status({"peer_id": "broken", "role": "worker", "epoch": 3, "at": live})
    r.hset(keys.peer("broken"), mapping={"pending_nodes": "{" + script, "links": '{"deliver.done": "' + img + '"}'})
    # Suspension entries: one hostile record, one that is no record at all.
    r.hset(keys.suspended, mapping={"deliver": json.dumps({"id": "s", "reason": img, "since": now}),
                                    svg: "{" + script})
    # Failed messages: hostile in every field, and one whose mark is not one twinflow wrote.
    hostile = r.xadd(keys.audit, {"node": img, "outlink": svg, "reason": script, "id": img, "at": link,
                                  "data": script}).decode()
    marked = r.xadd(keys.audit, {"node": "deliver", "outlink": "error", "reason": "refused", "id": "m-1",
                                 "at": str(now), "data": "{}"}).decode()
    r.hset(keys.audit_marks, marked, script)
    r.xadd(keys.events, entry_fields({"event": img, "peer": script, "epoch": 3, "at": now, "detail": svg}))
    console = None
    try:
        console, url = start_console(tmp_path, c, drills=(KILL_MASTER, {"drill": img, "seed": script, "messages": svg,
                                                                        "rto_s": link, "passed": False}))
        with chromium(1400, 1500) as driver:
            sign_in(driver, url, img, "read-token-for-the-console")
            driver.execute_script("document.querySelector('#f-status').value = 'ANY'")
            driver.find_element("css selector", "#failure-filter button[type=submit]").click()
            wait_until(lambda: len(texts_of(driver, "#failures tbody tr")) == 2, 15,
                       what=f"both audit entries: {texts_of(driver, '#failures tbody tr')}")
            wait_until(lambda: len(texts_of(driver, "#peers tbody tr")) == 3, 15,
                       what=f"three peer rows: {texts_of(driver, '#peers tbody tr')}")
            wait_until(lambda: "kill-master" in (text_of(driver, "#drills") or ""), 35, what="the drill reports")
            driver.find_element("css selector", f'#failures tr[data-ref="{hostile}"] .ref').click()
            wait_until(lambda: not driver.execute_script("return document.querySelector('#failure-shown').hidden"),
                       5, what="the hostile entry shown whole")
            save = shots(tmp_path / "screens")
            save(driver, "console-hostile")

            # Nothing ran, and no element came out of a value.
            assert driver.execute_script("return window.__pwned") is None
            made = driver.execute_script(
                "return document.querySelectorAll('#panels img, #panels script, #panels iframe, "
                "#panels svg:not(#graph-svg), #panels a[href^=javascript]').length")
            assert made == 0
            # Every hostile value is there as the text it is, where it belongs.
            peers = text_of(driver, "#peers tbody")
            assert img in peers and script in peers and svg in peers and link in peers
            assert roles(driver)["good"] == "master" and text_of(driver, "#master") == "good"
            broken = text_of(driver, '#peers tr[data-peer="broken"]')
            assert "malformed pending_nodes, links" in broken and "links, links" not in broken, broken
            assert roles(driver)[img] == script  # the badge of a role the page does not know, as text
            suspensions = text_of(driver, "#suspensions")
            assert f"deliver: {img}" in suspensions and f"{svg}: malformed ({{{script})" in suspensions
            row = text_of(driver, f'#failures tr[data-ref="{hostile}"]')
            assert img in row and svg in row and script in row and link in row
            assert text_of(driver, f'#failures tr[data-ref="{marked}"] .status') == "MALFORMED"
            assert script in text_of(driver, "#shown-body")
            assert img in text_of(driver, "#drills") and "FAILED" in text_of(driver, "#drills")
            assert img in text_of(driver, "#events tbody") and svg in text_of(driver, "#events tbody")
            assert "<" not in text_of(driver, "#who") and "img srcx" in text_of(driver, "#who")  # the name, cleaned
            assert text_of(driver, "#redis-state") == "Redis ok"

            # A part spoiled whole (the audit's counts) says so in its panel; the rest stays drawn.
            r.hset(keys.audit_counts, "removed", img)
            wait_until(lambda: "could not be read" in (text_of(driver, "#failures-panel .problem") or ""), 10,
                       what="the failures panel's note")
            assert roles(driver)["good"] == "master" and len(texts_of(driver, "#failures tbody tr")) == 2
            r.hdel(keys.audit_counts, "removed")
            wait_until(lambda: text_of(driver, "#failures-panel .problem[data-part=snapshot]") is None, 10,
                       what="the note gone once the value is")
    finally:
        if console is not None:
            console.terminate()
            console.wait(10)
        c.stop()
