"""The console's WSGI application: the page, its JSON API and the operator's actions.

Routes (all under ``/console``):

- ``GET /console/``: the page; ``GET /console/static/<file>``: its script and style;
- ``GET /console/api/whoami``: whether the caller may look and act, and as whom;
- ``GET /console/api/flow``: the flow's nodes and links (:func:`.snapshot.flow_shape`);
- ``GET /console/api/snapshot``: the live part (:class:`.snapshot.ConsoleView`);
- ``GET /console/api/failures?status=&node=&reason=&id=&limit=``: the audit, filtered, each
  entry without its message; ``GET /console/api/failures/<audit ID>``: one entry, whole;
- ``POST /console/api/resubmit`` (JSON ``{"refs": [...]}``) and ``POST /console/api/handover``:
  the actions, through the same calls as ``twinflow failures resubmit`` and
  ``twinflow handover``;
- ``GET /console/api/drills``: the drill results found in the reports directory.

Under failure: every API answer is JSON; a refused request is 401 or 403 with the reason
(:mod:`.access`); a bad parameter is 400 naming it; Redis not answering is 503 with the
reason within seconds (every Redis call of the console has a deadline: :mod:`.snapshot`),
and changes nothing, except a resubmit of several that Redis stopped answering part-way:
its 503 names each audit ID resubmitted before, the one Redis did not answer for and those
not tried. An action answers each audit ID with ``ok`` or its refusal, as the CLI does. A
body is read only to its ``Content-Length`` and at most ``MAX_BODY`` bytes (400 for a length
that is not a number of bytes, 413 past the limit), whatever server runs the application.
Every action, done or refused for its scope, is logged (event ``console_action``) with who
asked; what a client sent is logged with its control characters escaped (:mod:`.log_text`).
"""

from __future__ import annotations

import json
import logging
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import parse_qs, unquote

import redis

from ...logs import event
from ...runtime.store.audit import STATUSES, AuditError, AuditFilter
from ...runtime.store.store_errors import RedisUnavailable
from .access import ACT, READ, ConsoleAccess
from .drill_reports import drill_reports
from .headers import SECURITY_HEADERS, reason
from .snapshot import ConsoleView

log = logging.getLogger("twinflow.console")

STATIC = {"console.js": "text/javascript", "console.css": "text/css", "index.html": "text/html"}
MAX_BODY = 1 << 20        # an action's request body: a list of audit IDs (request_bounds.Bounds: the same)
LIST_LIMIT = 200          # entries one listing shows at most
_UNAVAILABLE = (redis.RedisError, RedisUnavailable, OSError)


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


class ConsoleApp:
    """The console of ``view``'s flow; ``handover`` asks the master to hand over (None: not offered),
    ``reports`` is where drill results are read (None: none)."""

    def __init__(self, view: ConsoleView, access: ConsoleAccess, *,
                 handover: Callable[[], list[dict]] | None = None, reports: Path | None = None):
        self.view, self.access, self.handover, self.reports = view, access, handover, reports

    def __call__(self, environ: dict, start_response) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            status, ctype, body = self._route(method, path, environ)
        except _BadRequest as exc:
            status, ctype, body = exc.status, "application/json", _json({"error": exc.why})
        except _UNAVAILABLE as exc:
            status, ctype, body = 503, "application/json", _json({"error": f"Redis did not answer: {exc}"})
        except Exception:  # the console must answer, and say so, whatever broke
            log.exception("console request %s %s failed", method, path)
            status, ctype, body = 500, "application/json", _json({"error": "the console failed; see its log"})
        headers = [("Content-Type", f"{ctype}; charset=utf-8"), ("Content-Length", str(len(body))),
                   *SECURITY_HEADERS]
        start_response(f"{status} {reason(status)}", headers)
        return [body]

    def _route(self, method: str, path: str, environ: dict) -> tuple[int, str, bytes]:
        if path in ("/console", "/console/") and method == "GET":
            return 200, "text/html", _static("index.html")
        if path.startswith("/console/static/") and method == "GET":
            name = path.rsplit("/", 1)[1]
            if name in STATIC:
                return 200, STATIC[name], _static(name)
            return 404, "text/plain", b"not found"
        if not path.startswith("/console/api/"):
            return 404, "text/plain", b"not found"
        api = path[len("/console/api/"):]
        need = ACT if method == "POST" else READ
        caller = self.access.caller(environ, need)
        if api == "whoami":  # answers also to a caller refused: the page asks it to sign in
            return 200, "application/json", _json({
                "may_look": caller.status == 200, "may_act": caller.may_act and caller.status == 200,
                "who": caller.who, "reason": caller.reason, "open": self.access.open,
                "handover": self.handover is not None, "flow": self.view.graph.name})
        if caller.status != 200:
            if need == ACT:
                event(log, logging.WARNING, "console_action", "%s refused to %s: %s", caller.who, api,
                      caller.reason, flow=self.view.graph.name, action=api, by=caller.who, ok=False)
            return caller.status, "application/json", _json({"error": caller.reason})
        if method == "GET":
            return self._get(api, environ)
        if method == "POST":
            return self._post(api, environ, caller.who)
        return 405, "application/json", _json({"error": f"{method} is not served here"})

    def _get(self, api: str, environ: dict) -> tuple[int, str, bytes]:
        if api == "flow":
            return 200, "application/json", _json(self.view.shape)
        if api == "snapshot":
            return 200, "application/json", _json(self.view.snapshot())
        if api == "failures":
            return 200, "application/json", _json(self._failures(parse_qs(environ.get("QUERY_STRING", ""))))
        if api.startswith("failures/"):
            ref = unquote(api[len("failures/"):])
            try:
                return 200, "application/json", _json(self.view.failures.show(ref))
            except AuditError as exc:
                return 404, "application/json", _json({"error": exc.reason})
        if api == "drills":
            return 200, "application/json", _json(drill_reports(self.reports))
        return 404, "application/json", _json({"error": f"no such API: {api}"})

    def _failures(self, query: dict) -> dict:
        def one(name: str) -> str | None:
            return (query.get(name) or [""])[0].strip() or None

        status = one("status") or "FAILED"
        if status != "ANY" and status not in STATUSES:
            raise _BadRequest(400, f"status must be {', '.join(STATUSES)} or ANY, not {status[:40]!r}")
        filt = AuditFilter(node=one("node"), reason=one("reason"), status="" if status == "ANY" else status)
        wanted = one("id")
        limit_text = one("limit") or str(LIST_LIMIT)
        if not limit_text.isdecimal() or len(limit_text) > 9:
            raise _BadRequest(400, f"limit must be a whole number of entries (1 to {LIST_LIMIT}), "
                                   f"not {limit_text[:40]!r}")
        limit = max(1, min(LIST_LIMIT, int(limit_text)))
        # A search by message ID reads the filtered audit and keeps the entries whose ID has it.
        rows = self.view.failures.list(filt, limit=limit if not wanted else 10_000)
        if wanted:
            rows = [r for r in rows if wanted in (r.get("id") or r.get("message_id") or "")][:limit]
        for row in rows:
            row.pop("message", None)  # a page of entries, not of bodies: one is shown whole on request
        return {"entries": rows, "counts": self.view.failures.counts(), "limit": limit}

    def _post(self, api: str, environ: dict, who: str) -> tuple[int, str, bytes]:
        flow = self.view.graph.name
        if api == "resubmit":
            refs = _body(environ).get("refs")
            if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
                return 400, "application/json", _json({"error": "give refs: a list of audit IDs"})
            results = []
            for k, ref in enumerate(refs):
                try:
                    results += [r.as_dict() for r in self.view.failures.resubmit([ref], by=who)]
                except _UNAVAILABLE as exc:
                    return self._resubmit_cut(refs, k, results, exc, who)
            done = [r["audit_id"] for r in results if r["ok"]]
            event(log, logging.INFO, "console_action", "%s resubmitted %d of %d failed messages", who, len(done),
                  len(refs), flow=flow, action="resubmit", by=who, refs=refs, resubmitted=done, ok=True)
            return 200, "application/json", _json({"results": results})
        if api == "handover":
            if self.handover is None:
                return 404, "application/json", _json({"error": "this console cannot ask for a handover"})
            results = self.handover()
            event(log, logging.INFO, "console_action", "%s asked the master to hand over", who, flow=flow,
                  action="handover", by=who, results=results, ok=all(r.get("ok") for r in results))
            return 200, "application/json", _json({"results": results})
        return 404, "application/json", _json({"error": f"no such action: {api}"})

    def _resubmit_cut(self, refs: list[str], k: int, results: list[dict], exc: Exception,
                      who: str) -> tuple[int, str, bytes]:
        """Redis stopped answering at ``refs[k]``: 503, with what was done before it and what was not."""
        done = [r["audit_id"] for r in results if r["ok"]]
        results = [*results, {"audit_id": refs[k], "ok": False, "reason": f"Redis did not answer: {exc}"},
                   *({"audit_id": ref, "ok": False, "reason": "not tried: Redis did not answer"} for ref in refs[k + 1:])]
        event(log, logging.WARNING, "console_action", "%s resubmitted %d of %d failed messages before Redis "
              "stopped answering", who, len(done), len(refs), flow=self.view.graph.name, action="resubmit", by=who,
              refs=refs, resubmitted=done, ok=False)
        return 503, "application/json", _json({"error": f"Redis did not answer: {exc}", "results": results})


class _BadRequest(Exception):
    """A request refused for what it sent: ``status`` and why, naming the parameter."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status, self.why = status, why


def _body(environ: dict) -> dict:
    """The request's JSON object body, read to its Content-Length and never past ``MAX_BODY``."""
    length = str(environ.get("CONTENT_LENGTH") or "0").strip()
    if not length.isdecimal():
        raise _BadRequest(400, f"Content-Length must be a number of bytes, not {length[:20]!r}")
    size = int(length)
    if size > MAX_BODY:
        raise _BadRequest(413, f"the body is {size} bytes; at most {MAX_BODY} are taken")
    try:
        body = json.loads(environ["wsgi.input"].read(size) or b"{}")
    except (ValueError, KeyError):
        return {}
    return body if isinstance(body, dict) else {}


def _json(value) -> bytes:
    return json.dumps(value, default=str).encode()

