"""twinflow's development tools: the lab, the deployment guide runner, the flow bench and the demo.

A second top-level package of the twinflow distribution, beside ``twinflow``: the commands
that use it (``twinflow lab``, ``twinflow demo``, ``twinflow bench``, the drills between hosts)
import it only inside the command, and a peer (``twinflow run``) never imports it
(``tests/test_run_imports.py``). Nothing here is public API: it may change in any release.
The small harness for users' tests (``LocalCluster``, the checker, the producers, local
servers) is :mod:`twinflow.testing`.

- :mod:`.lab_network`, :mod:`.lab_hosts`, :mod:`.lab`, :mod:`.lab_flow`, :mod:`.lab_faults`,
  :mod:`.lab_console`, :mod:`.lab_client`: a lab of hosts on this machine (network namespaces
  on a private bridge), ``twinflow lab``;
- :mod:`.guide_lab` and its :mod:`.guide_blocks`, :mod:`.guide_block_runs`, :mod:`.guide_units`,
  :mod:`.guide_servers`, :mod:`.guide_hosts`, :mod:`.systemd_unit`: the deployment guide run
  as written on a lab of three hosts (``twinflow lab up --guide``);
- :mod:`.flow_bench`, :mod:`.bench_stats`, :mod:`.shard_passthrough`: the flow bench
  (``twinflow bench``) and the benches' figures;
- :mod:`.demo`: ``twinflow demo``.
"""
