"""Uplink positions: Redis stream entry IDs, and the order they sort in."""

WARMUP_POSITION = "warmup"  # the reader's first row, never a Redis entry ID (always "<ms>-<seq>")
# A row's size when the row is no entry but the processed entries a reader skipped, up to its
# position (runtime/spark/source.py, "Skipping what is processed"): the batch handled them.
SKIPPED_SIZE = -1


def skipped_row(position: str) -> tuple[str, None, int]:
    """The row that stands for the processed entries a reader skipped up to ``position``."""
    return position, None, SKIPPED_SIZE


def position_order(position: str) -> tuple[int, int]:
    """A Redis stream entry ID ("<ms>-<seq>") as a tuple that sorts in uplink order."""
    ms, _, seq = position.partition("-")
    return int(ms), int(seq or 0)
