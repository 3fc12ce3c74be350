"""A node's roles on one flow: master (runs the flow and commits), worker (bakes and waits
for claims), and starting (before it joined the election)."""

MASTER, WORKER, STARTING = "master", "worker", "starting"
