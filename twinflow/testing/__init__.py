"""The harness for tests of a flow, as ``kazoo.testing`` ships with kazoo.

- :mod:`.local_cluster`: ``LocalCluster``, one local cluster of N peers of a flow,
  optionally with the fault proxy on every link;
- :mod:`.checker`: the one invariant checker (lost, duplicated, out of order, stale
  writes, RTO);
- :mod:`.producers`, :mod:`.messages`, :mod:`.flow_messages`, :mod:`.flow_plan`: publishing
  to a local cluster, the demo's message mix, and messages made for any flow from its flow
  file's own fields;
- :mod:`.servers`, :mod:`.services`, :mod:`.redis_ha`, :mod:`.zk_ensemble`,
  :mod:`.spark_standalone`: real Redis, Sentinel, Redis Cluster, ZooKeeper and Spark
  standalone servers on loopback, started and stopped by PID;
- :mod:`.processes`, :mod:`.proc_stats`: ``twinflow run`` peer processes, their CPU time and
  memory.

The lab, the deployment guide runner, the flow bench and the demo are development tools
in :mod:`twinflow_dev`, not here. Nothing here is on a peer's import path: ``twinflow
run`` finds the servers that ``twinflow services up`` recorded with
:mod:`twinflow.services_state`, which reads the state file alone.
"""
