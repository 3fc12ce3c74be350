"""The cluster tests' fixture: a :class:`~twinflow.testing.local_cluster.LocalCluster` on the
session's Redis and ZooKeeper, one flow of its own per test, no peer started (``cluster.peer(id)``)."""

from __future__ import annotations

import pytest

from tests.cluster.harness import cluster_on


@pytest.fixture
def cluster(tmp_path, services, flow_name, request):
    """The claim pair, or what a ``@pytest.mark.flow(...)`` marker asks: ``text=`` a flow file, or
    the claim pair's settings (``bake_time=``, ``max_pending=``, ``max_bytes=``, ``batch_size=``)."""
    marker = request.node.get_closest_marker("flow")
    c = cluster_on(services, tmp_path, flow_name, **(marker.kwargs if marker else {}))
    yield c
    c.stop()
