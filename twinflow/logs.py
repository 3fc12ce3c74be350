"""A peer's log: one line per event an operator acts on, as text or as JSON lines.

``configure(level, fmt)`` sets up the process's log on stderr (``twinflow
--log-format text|json``). An event that matters to an operator (a
promotion, a demotion, a fenced write, an outage and its end) is logged
through :func:`event`, which names it (``promoted``, ``redis_down``, ...)
and carries the flow, the peer (the ``twinflow run`` process) and the epoch
it happened at, passed by the caller: a sharded flow's peer runs one member
per shard in one process, so no process-wide context could tell them apart.

Text keeps the usual shape and adds the flow, peer and epoch when the
record has them; JSON writes one object per line with every field:

>>> import io, json, logging
>>> out = io.StringIO()
>>> handler = logging.StreamHandler(out)
>>> handler.setFormatter(formatter("json"))   # what configure(level, "json") puts on the root logger
>>> example = logging.getLogger("twinflow.example")
>>> example.addHandler(handler)
>>> example.propagate = False
>>> event(example, logging.WARNING, "rolled_back", "%d messages rolled back", 3,
...       flow="orders", peer="a", epoch=7, count=3)
>>> line = json.loads(out.getvalue())
>>> line["event"], line["flow"], line["peer"], line["epoch"], line["count"], line["msg"]
('rolled_back', 'orders', 'a', 7, 3, '3 messages rolled back')

A formatter never raises: a record whose arguments do not fit its message
still prints its message, its arguments and the error.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import datetime, timezone
from typing import Any, TextIO

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")
CONTEXT = ("flow", "peer", "epoch")  # what an operator filters a peer's log by
NOISY = ("kazoo", "py4j", "urllib3")  # chatty at INFO about things the peer logs itself, if they matter

# Attributes every LogRecord has: anything else on a record came in through ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def event(logger: logging.Logger, level: int, name: str, msg: str, /, *args: Any, flow: str | None = None,
          peer: str | None = None, epoch: int | None = None, exc_info: Any = None, **fields: Any) -> None:
    """Log the operator event ``name`` (a short stable name) with its flow, peer, epoch and fields.

    ``msg % args`` is the human sentence; ``fields`` are what a program reads
    (``count``, ``reason``, ``seconds``). A field named like a LogRecord
    attribute (``msg``, ``name``) gets a ``_`` appended instead of breaking the call.
    """
    if not logger.isEnabledFor(level):
        return
    extra = {"event": name}
    for key, value in (("flow", flow), ("peer", peer), ("epoch", epoch), *fields.items()):
        if value is not None:
            extra[key + "_" if key in _STANDARD else key] = value
    logger.log(level, msg, *args, exc_info=exc_info, extra=extra)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:
        return f"<unprintable {type(value).__name__}: {type(exc).__name__}>"


def _message(record: logging.LogRecord) -> str:
    """``record.getMessage()``, or the message and arguments as they are when they do not fit."""
    try:
        return record.getMessage()
    except Exception as exc:
        return f"{_safe_repr(record.msg)} % {_safe_repr(record.args)} (bad log call: {type(exc).__name__}: {exc})"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    """``<asctime> <LEVEL> <logger>: <message>`` then `` flow=… peer=… epoch=…`` when known."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        try:
            record.message = _message(record)
            record.asctime = self.formatTime(record, self.datefmt)
            line = self.formatMessage(record)
            context = [f"{k}={getattr(record, k)}" for k in CONTEXT if getattr(record, k, None) is not None]
            if context:
                line += " " + " ".join(context)
            if record.exc_info and not record.exc_text:
                record.exc_text = self.formatException(record.exc_info)
            if record.exc_text:
                line += "\n" + record.exc_text
            if record.stack_info:
                line += "\n" + self.formatStack(record.stack_info)
            return line
        except Exception as exc:  # a log line must come out whatever the record holds
            return f"{record.levelname} {record.name}: {_message(record)} (unformattable record: {exc!r})"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then flow, peer, epoch, event, the
    event's fields and exc (the traceback) when there are any."""

    def format(self, record: logging.LogRecord) -> str:
        try:
            out: dict[str, Any] = {
                "ts": datetime.fromtimestamp(record.created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
                + f".{int(record.msecs):03d}Z",
                "level": record.levelname,
                "logger": record.name,
                "msg": _message(record),
            }
            extras = _extras(record)
            # flow, peer, epoch and event first: the columns a reader scans by.
            first = {k: extras.pop(k) for k in (*CONTEXT, "event") if k in extras}
            for key, value in {**first, **extras}.items():
                if value is not None:
                    out[key + "_" if key in out else key] = value  # never lose a field to a name clash
            if record.exc_info:
                out["exc"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
            elif record.exc_text:
                out["exc"] = record.exc_text
            if record.stack_info:
                out["stack"] = record.stack_info
            return json.dumps(out, default=_safe_str)
        except Exception as exc:  # never raise: fall back to the fields that cannot fail
            return json.dumps({"level": getattr(record, "levelname", "?"), "logger": getattr(record, "name", "?"),
                               "msg": _message(record), "log_error": _safe_repr(exc)})


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception:
        return _safe_repr(value)


def formatter(fmt: str) -> logging.Formatter:
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure(level: int, fmt: str = "text", stream: TextIO | None = None) -> logging.Handler:
    """Log at ``level`` and above to ``stream`` (default stderr) in ``fmt`` ("text" or "json").

    Replaces the handler an earlier ``configure`` installed (so configuring twice
    does not print every line twice) and leaves other handlers alone; the
    chatty libraries (kazoo, py4j, urllib3) log WARNING and above only.
    Returns the handler.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler._twinflow = True  # type: ignore[attr-defined]
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_twinflow", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return handler
