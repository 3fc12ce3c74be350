"""Fault drills, the fault proxy and the failover simulator (the ``twinflow[chaos]`` extra); the
promises they check are judged by :mod:`twinflow.testing.checker`."""
