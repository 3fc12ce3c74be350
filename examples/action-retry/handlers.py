"""Example handlers for examples/action-retry: a service that is busy at first."""

from twinflow.runtime.nodes.action import TransientError

_attempts: dict[str, int] = {}


def busy_twice(msg):
    """Fails transiently on the first two attempts for each message, then succeeds."""
    _attempts[msg.id] = _attempts.get(msg.id, 0) + 1
    if msg.doc.get("busy") and _attempts[msg.id] <= 2:
        raise TransientError("service busy")
    if msg.doc.get("broken"):
        raise ValueError("order total is negative")
