"""Tools for running twinflow locally, as ``kazoo.testing`` ships with kazoo.

- :mod:`.servers`, :mod:`.services`, :mod:`.redis_ha`, :mod:`.zk_ensemble`,
  :mod:`.spark_standalone`: real Redis, Sentinel, Redis Cluster, ZooKeeper and Spark
  standalone servers on loopback, started and stopped by PID;
- :mod:`.processes`: ``twinflow run`` peer processes;
- :mod:`.local_cluster`: one local cluster of N peers, optionally with the fault proxy
  on every link;
- :mod:`.lab_network`, :mod:`.lab_hosts`, :mod:`.lab`, :mod:`.lab_client`: a lab of hosts on
  this machine (network namespaces on a private bridge), ``twinflow lab``;
- :mod:`.checker`: the one invariant checker (lost, duplicated, out of order, stale
  writes, RTO);
- :mod:`.messages`, :mod:`.demo`, :mod:`.flow_bench`: the demo's messages, the demo and
  the flow bench.

Nothing here is on a peer's import path: ``twinflow run`` imports only
:mod:`.services` (the standard library alone) to find the servers that ``twinflow
services up`` recorded, when no address is given.
"""
