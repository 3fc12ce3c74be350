"""A member's roles on its flow: master (runs the flow and commits), worker (bakes and waits
for claims), and starting (before it joined the election)."""

MASTER, WORKER, STARTING = "master", "worker", "starting"
