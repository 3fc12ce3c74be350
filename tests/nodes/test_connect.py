"""Waiting for a server: retries with back-off, then a clear error naming it (fake time)."""

import pytest

from twinflow.cluster.connect import ServiceUnavailable, wait_for_service as wait_for


class FakeTime:
    def __init__(self):
        self.t = 0.0
        self.sleeps = []

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += s

    def monotonic(self):
        return self.t


def test_retries_until_the_server_answers():
    ft, calls = FakeTime(), []

    def attempt():
        calls.append(ft.t)
        if len(calls) < 4:
            raise ConnectionError("refused")
        return "client"

    assert wait_for("Redis", "redis://h:1", attempt, 10, sleep=ft.sleep, monotonic=ft.monotonic) == "client"
    assert len(calls) == 4 and ft.sleeps == [0.05, 0.1, 0.2]


def test_gives_up_at_the_deadline_naming_service_and_address():
    ft = FakeTime()

    def attempt():
        raise ConnectionError("refused")

    with pytest.raises(ServiceUnavailable) as err:
        wait_for("ZooKeeper", "zk1:2181,zk2:2181", attempt, 5, sleep=ft.sleep, monotonic=ft.monotonic)
    assert "ZooKeeper at zk1:2181,zk2:2181" in str(err.value) and "refused" in str(err.value)
    assert 5 <= ft.t < 7 and max(ft.sleeps) <= 2.0
