"""The log formats (twinflow/logs.py): text and JSON lines, event fields, tracebacks, and
records that would break a formatter. Pure: records are made by hand, nothing is started."""

import io
import json
import logging
import re
import sys

import pytest

from twinflow import logs

TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def record(msg="hello %s", args=("world",), level=logging.INFO, exc_info=None, **extra):
    rec = logging.LogRecord("twinflow.peer", level, __file__, 1, msg, args, exc_info)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def text(rec):
    return logs.formatter("text").format(rec)


def as_json(rec):
    line = logs.formatter("json").format(rec)
    assert "\n" not in line  # one record, one line, whatever it holds
    return json.loads(line)


@pytest.fixture
def captured():
    """A logger whose records go through ``event`` to a JSON handler only (not the root's)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.formatter("json"))
    logger = logging.getLogger("twinflow.test_logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, lambda: [json.loads(line) for line in out.getvalue().splitlines()]
    logger.removeHandler(handler)


def test_text_without_context_keeps_the_old_shape():
    line = text(record())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO twinflow\.peer: hello world", line), line


def test_text_appends_flow_peer_and_epoch_when_known():
    assert text(record(flow="orders", peer="a", epoch=3, event="promoted")).endswith(
        "twinflow.peer: hello world flow=orders peer=a epoch=3")
    # Only what the record has: a store knows no epoch before it read one.
    assert text(record(flow="orders", peer="a")).endswith("hello world flow=orders peer=a")


def test_json_has_the_fixed_fields_then_the_context_and_the_event_fields():
    out = as_json(record(flow="orders", peer="a", epoch=3, event="rolled_back", count=7))
    assert TS.match(out["ts"]), out["ts"]
    assert out == {"ts": out["ts"], "level": "INFO", "logger": "twinflow.peer", "msg": "hello world",
                   "flow": "orders", "peer": "a", "epoch": 3, "event": "rolled_back", "count": 7}
    assert list(out)[:8] == ["ts", "level", "logger", "msg", "flow", "peer", "epoch", "event"]


def test_json_ts_is_utc_with_milliseconds():
    rec = record()
    rec.created, rec.msecs = 0.25, 250.0  # 1970-01-01T00:00:00.250 UTC, whatever the local zone
    assert as_json(rec)["ts"] == "1970-01-01T00:00:00.250Z"


def test_json_without_context_has_no_context_keys():
    out = as_json(record())
    assert set(out) == {"ts", "level", "logger", "msg"}


def test_event_passes_context_and_fields(captured):
    logger, lines = captured
    logs.event(logger, logging.WARNING, "demoted", "%s demoted (%s)", "a", "fenced",
               flow="orders", peer="a", epoch=4, reason="fenced")
    [out] = lines()
    assert (out["level"], out["msg"], out["event"], out["flow"], out["peer"], out["epoch"], out["reason"]) == \
        ("WARNING", "a demoted (fenced)", "demoted", "orders", "a", 4, "fenced")


def test_event_leaves_out_unknown_context_and_renames_reserved_field_names(captured):
    logger, lines = captured
    # "msg", "name" and "args" are LogRecord attributes: as extra they would make logging raise.
    logs.event(logger, logging.INFO, "started", "up", flow="orders", peer=None, msg="m", name="n", args=1)
    [out] = lines()
    assert out["msg"] == "up" and out["msg_"] == "m" and out["name_"] == "n" and out["args_"] == 1
    assert "peer" not in out and "epoch" not in out


def test_event_below_the_level_logs_nothing(captured):
    logger, lines = captured
    logger.setLevel(logging.WARNING)
    logs.event(logger, logging.INFO, "backpressure_off", "reads again", flow="f")
    assert lines() == []


def test_exceptions_are_kept_as_exc_in_json_and_after_the_line_in_text():
    try:
        raise ValueError("boom")
    except ValueError:
        exc_info = sys.exc_info()
    out = as_json(record(exc_info=exc_info, event="batch_failed", flow="f"))
    assert out["exc"].startswith("Traceback (most recent call last):") and out["exc"].endswith("ValueError: boom")
    lines = text(record(exc_info=exc_info, flow="f")).splitlines()
    assert lines[0].endswith("hello world flow=f") and lines[-1] == "ValueError: boom"


def test_a_record_whose_arguments_do_not_fit_still_prints():
    rec = record("%d messages", ("many",))
    assert "'%d messages'" in text(rec) and "'many'" in text(rec) and "TypeError" in text(rec)
    out = as_json(rec)
    assert "'%d messages'" in out["msg"] and "bad log call" in out["msg"]
    assert "hello" in as_json(record("hello %s %s", ("one",)))["msg"]  # too few arguments


class Unprintable:
    def __str__(self):
        raise RuntimeError("no str")

    __repr__ = __str__


def test_unprintable_messages_and_fields_still_print():
    out = as_json(record(Unprintable(), (), flow="f", weird=Unprintable()))
    assert "unprintable Unprintable" in out["msg"] and "unprintable Unprintable" in out["weird"]
    assert "unprintable Unprintable" in text(record(Unprintable(), ()))


def test_fields_that_json_cannot_hold_are_written_as_text():
    out = as_json(record(event="x", path={1, 2}.__class__, blob=b"\x00"))
    assert out["path"] == "<class 'set'>" and out["blob"] == "b'\\x00'"


def test_a_field_named_like_a_fixed_key_does_not_replace_it():
    out = as_json(record(ts="mine", logger=3))
    assert TS.match(out["ts"]) and out["ts_"] == "mine" and out["logger"] == "twinflow.peer" and out["logger_"] == 3


def test_a_circular_field_falls_back_to_a_line_that_parses():
    loop = []
    loop.append(loop)
    out = as_json(record(loop=loop))
    assert out["msg"] == "hello world" and "log_error" in out


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="expected one of text, json"):
        logs.formatter("xml")


def test_configure_replaces_its_own_handler_and_quiets_noisy_loggers():
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    noisy = {n: logging.getLogger(n).level for n in logs.NOISY}
    first, second = io.StringIO(), io.StringIO()
    try:
        logs.configure(logging.INFO, "text", stream=first)
        logs.configure(logging.DEBUG, "json", stream=second)
        ours = [h for h in root.handlers if h not in before]
        assert len(ours) == 1 and isinstance(ours[0].formatter, logs.JsonFormatter)
        assert root.level == logging.DEBUG
        assert all(logging.getLogger(n).level == logging.WARNING for n in ("kazoo", "py4j", "urllib3"))
        logging.getLogger("twinflow.test").debug("only in the second")
        assert first.getvalue() == "" and json.loads(second.getvalue())["msg"] == "only in the second"
    finally:
        for h in [h for h in root.handlers if h not in before]:
            root.removeHandler(h)
        root.setLevel(level)
        for name, was in noisy.items():  # as they were: later tests read kazoo's DEBUG lines
            logging.getLogger(name).setLevel(was)
