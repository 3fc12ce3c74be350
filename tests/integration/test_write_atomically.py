"""The reader's control files are replaced whole, also when writers race.

A member's timer thread and its promotion both set the reader's pace; with one shared
aside file, one writer's replace took the other's away and the promotion failed (a
host-crash drill's run: "No such file or directory: '.../pace.tmp' -> '.../pace'").
"""

from __future__ import annotations

import threading

from twinflow.runtime.spark.reader_gates import write_atomically


def test_racing_writers_all_succeed_and_the_file_is_one_of_their_texts(tmp_path):
    path = str(tmp_path / "pace")
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def writer(text: str) -> None:
        start.wait()
        try:
            for _ in range(300):
                write_atomically(path, text)
        except BaseException as exc:  # noqa: BLE001 - what the test is looking for
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(str(n) * 50,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors[:3]
    assert open(path).read() in {str(n) * 50 for n in range(4)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pace"]  # nothing left aside
