"""A flow's suspensions in Redis: which action nodes suspended the flow, and requests to resume.

An action node with ``on_retry_failure: suspend`` whose retries are used up
suspends the flow. The master's step that suspended it writes the
suspension to ``tf:{F}:suspended`` (node -> JSON: id, reason, since, until)
in its COMMIT, and the step that resumes removes it, so the record is
fenced and replicated like the node state it mirrors, and a promoted master
finds the suspension in the state it loads. Every peer reads the record to
hold its uplink reading (``cluster/member_timers.py``).

``twinflow resume`` writes a request naming each suspension it ends by its
node and ``since``: the master resumes a suspension only when the request
names that one, so a request left behind never ends a later suspension.
Under failure: reads and the request go through the store's retrying call
(``redis_calls.py``); a request that cannot be written raises
RedisUnavailable and changes nothing.
"""

from __future__ import annotations

import json
import time

from ..json_text import compact

RESUME_REQUEST_TTL_S = 86400  # a request nobody acted on (no master for a day) is dropped


class Suspensions:
    """The suspension calls of a :class:`~.flow_store.FlowStore` (it provides ``r``, ``keys``, ``_call``)."""

    def suspensions(self, deadline_s: float | None = None) -> dict[str, dict]:
        """Every suspended action node of the flow: name -> id, reason, since, until."""
        raw = self.call("suspensions", lambda: self.r.hgetall(self.keys.suspended), deadline_s)
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def suspension_records(self, deadline_s: float | None = None) -> dict[str, dict]:
        """As :meth:`suspensions`, for a reader that shows them (the console): a record that is not
        a JSON object is ``{"malformed": its text}`` instead of raising."""
        raw = self.call("suspensions", lambda: self.r.hgetall(self.keys.suspended), deadline_s)
        out = {}
        for key, value in raw.items():
            text = value.decode("utf-8", "replace")
            try:
                record = json.loads(text)
            except ValueError:
                record = None
            out[key.decode("utf-8", "replace")] = record if isinstance(record, dict) else {"malformed": text}
        return out

    def request_resume(self, by: str, now: float | None = None, deadline_s: float | None = None) -> dict[str, dict]:
        """Ask the master to end every suspension the flow has now; returns them (empty: the flow
        is not suspended, and nothing is written)."""
        held = self.suspensions(deadline_s)
        if held:
            request = {"nodes": {node: s["since"] for node, s in held.items()}, "by": by,
                       "at": time.time() if now is None else now}
            self.call("request resume", lambda: self.r.set(self.keys.resume, compact(request),
                                                           ex=RESUME_REQUEST_TTL_S), deadline_s)
        return held

    def resume_requested(self, held: dict[str, dict], deadline_s: float | None = None) -> bool:
        """Whether a resume request names one of the suspensions ``held`` (node -> record)."""
        raw = self.call("resume request", lambda: self.r.get(self.keys.resume), deadline_s)
        if raw is None:
            return False
        try:
            nodes = json.loads(raw)["nodes"]
        except (ValueError, KeyError, TypeError):
            return False  # not a request this code wrote: never acted on
        return any(node in nodes and nodes[node] == s["since"] for node, s in held.items())
