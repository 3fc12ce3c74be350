"""Example resolver for examples/history-resolver: asks an order ledger what happened."""

from twinflow.runtime.nodes.history import DUPLICATE, NEW

BOOKED = {"order-4001"}  # stands in for a query to the downstream system


def ask_ledger(msg, doubt):
    """Duplicate if the ledger booked the order, else New; refuses UUIDs it cannot look up."""
    if doubt.started is None:
        raise LookupError(f"the ledger cannot look up {doubt.uuid[:16]}...")
    return DUPLICATE if doubt.uuid in BOOKED else NEW
