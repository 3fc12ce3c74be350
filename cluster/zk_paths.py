"""Where a flow lives in ZooKeeper, named once (as ``runtime/store/flow_keys.py`` names its Redis keys).

Every znode of flow ``F`` is under ``/twinflow/F``:

- ``election``: kazoo's Election recipe, one child per peer contending for the master role;
- ``epoch``: the master's peer ID; its version is the fencing epoch (a promotion writes it);
- ``members/<peer>``: one ephemeral znode per live peer, holding its gRPC address.

>>> paths = ZkPaths("orders")
>>> paths.root, paths.epoch, paths.member("peer-a")
('/twinflow/orders', '/twinflow/orders/epoch', '/twinflow/orders/members/peer-a')
>>> paths.own()
('/twinflow/orders', '/twinflow/orders/election', '/twinflow/orders/members', '/twinflow/orders/epoch')
"""

from __future__ import annotations

from dataclasses import dataclass

PARENT = "/twinflow"  # every flow's znodes are below it (zk_auth.py guards it)


@dataclass(frozen=True)
class ZkPaths:
    """The znodes of one flow (see the module docstring)."""

    flow: str

    @property
    def root(self) -> str:
        return f"{PARENT}/{self.flow}"

    @property
    def election(self) -> str:
        return f"{self.root}/election"

    @property
    def epoch(self) -> str:
        return f"{self.root}/epoch"

    @property
    def members(self) -> str:
        return f"{self.root}/members"

    def member(self, peer_id: str) -> str:
        return f"{self.members}/{peer_id}"

    def own(self) -> tuple[str, ...]:
        """The flow's own znodes: its root, then the three it keeps under it."""
        return self.root, self.election, self.members, self.epoch
