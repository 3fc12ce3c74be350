"""Deterministic failover simulation (``twinflow simulate``): the cluster's own peer code on a
virtual clock, with Redis, ZooKeeper and the escalation links replaced by in-memory models."""
