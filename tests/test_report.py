"""The drill report: timeline data from outputs, and the picture and Markdown drawn from it."""

from twinflow.testing.checker import SinkEntry
from twinflow.chaos.report import timeline, write_report

COLUMNS = ["drill", "seed", "messages", "lost", "duplicated", "rto_s", "passed"]


def test_timeline_marks_each_epochs_first_write_as_a_role_change():
    t = 1_800_000_000.0
    outputs = {"deliver.done": [SinkEntry("m1", 1, "a", 1_800_000_000_100), SinkEntry("m2", 1, "a", 1_800_000_000_600),
                                SinkEntry("m4", 2, "b", 1_800_000_003_000)],
               "match.expired": [SinkEntry("m3", 1, "a", 1_800_000_000_900)]}
    tl = timeline(outputs, [[t + 1.0, t + 1.0, "SIGKILL master a"], [t + 0.5, None, "latency"]])
    assert [n for _, n in tl["writes"]] == ["a", "a", "a", "b"]  # in time order, every outlink
    assert tl["roles"] == [(1_800_000_000_100, "a", 1), (1_800_000_003_000, "b", 2)]
    # An open window ends at the last write.
    assert tl["windows"] == [(1_800_000_001_000, 1_800_000_001_000, "SIGKILL master a"),
                             (1_800_000_000_500, 1_800_000_003_000, "latency")]


def test_the_report_links_a_png_per_drill_and_the_rerun_of_a_failure(tmp_path):
    outputs = {"deliver.done": [SinkEntry(f"m{i}", 1 + (i >= 50), "ab"[i >= 50], 1_800_000_000_000 + 40 * i)
                                for i in range(100)]}
    tl = timeline(outputs, [[1_800_000_001.9, None, "SIGSTOP a"]])
    results = [{"drill": "kill-master", "seed": 3, "messages": 100, "lost": 0, "duplicated": 0, "rto_s": 0.4,
                "passed": True, "timeline": tl},
               {"drill": "pause-master", "seed": 3, "messages": 100, "lost": 2, "duplicated": 0, "rto_s": 0.4,
                "passed": False, "rerun": "twinflow drill pause-master --seed 3 --messages 100", "timeline": tl}]
    report = write_report(results, tmp_path / "r", COLUMNS)
    text = report.read_text()
    assert "| kill-master | 3 | 100 | 0 | 0 | 0.4 | True |" in text
    assert "![kill-master](kill-master-seed3.png)" in text and "![pause-master](pause-master-seed3.png)" in text
    assert "FAILED; rerun: `twinflow drill pause-master --seed 3 --messages 100`" in text
    for name in ("kill-master-seed3.png", "pause-master-seed3.png"):
        data = (tmp_path / "r" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


def test_recovery_runs_to_the_new_epochs_first_write_not_the_dying_masters_last():
    from twinflow.testing.checker import recovery_s

    ms = 1_800_000_000_000
    writes = [SinkEntry("m1", 1, "a", ms), SinkEntry("m2", 1, "a", ms + 1_001),  # in flight as the kill began
              SinkEntry("m3", 2, "b", ms + 2_500), SinkEntry("m4", 2, "b", ms + 2_600)]
    assert recovery_s(writes, 1_800_000_001.0) == 2.5
    # Without a failover (the same master writes on), the gap to its next write.
    assert recovery_s(writes[:2], 1_800_000_000.5) == 1.001
    assert recovery_s(writes, 1_800_000_009.0) is None  # nothing after the fault
