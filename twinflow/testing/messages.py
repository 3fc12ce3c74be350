"""The messages the demo, the drills, the simulator and the benches publish.

``order_or_payment(seq)`` is message ``seq`` of the chained flow
(examples/cluster-chained.yaml): orders and their payments in pairs, one
order in ten alone (it expires), one in ten sent twice under a new ID (the
history catches it).

>>> [order_or_payment(i)["id"] for i in (0, 1, 9, 18, 19)]
['o000000', 'p000000', 'd000004', 'o000009', 'x000009']
"""

from __future__ import annotations

from pathlib import Path

# The demo, drills and simulator run from a source checkout (`make demo`), where the example lives.
CHAINED = Path(__file__).resolve().parents[2] / "examples" / "cluster-chained.yaml"


def order_or_payment(seq: int) -> dict:
    """Message ``seq`` of the chained demo: orders and their payments, in pairs. Order 10k+9
    never gets a payment (it expires); order 10k+4's second message is the order sent again
    under a new message ID (the history sends it to ``duplicate``)."""
    k, second = divmod(seq, 2)
    doc = {"id": f"o{k:06d}", "uuid": f"order-{k}", "type": "order", "order_id": k, "seq": seq}
    if second and k % 10 == 9:
        return {**doc, "id": f"x{k:06d}", "uuid": f"lone-{k}", "order_id": -k}  # an order alone
    if second and k % 10 == 4:
        return {**doc, "id": f"d{k:06d}"}  # the same order again
    if second:
        return {"id": f"p{k:06d}", "uuid": f"payment-{k}", "type": "payment", "order_id": k, "seq": seq}
    return doc
