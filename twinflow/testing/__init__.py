"""Tools for running twinflow locally, as ``kazoo.testing`` ships with kazoo: real servers on
loopback (:mod:`.services`, :mod:`.redis_ha`, :mod:`.zk_ensemble`, :mod:`.spark_standalone`),
``twinflow run`` node processes (:mod:`.processes`), the demo and the flow bench.

Nothing here is on a node's import path: ``twinflow run`` never imports this package.
"""
