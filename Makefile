# The two commands: `make demo` and `make test`. Both install what is missing first.
.PHONY: demo test bootstrap proto bench services-up services-down clean

bootstrap:
	@scripts/bootstrap.sh

# `make demo CONSOLE=127.0.0.1:8470`: the operator console of the demo's cluster, kept running after the count.
demo: bootstrap
	.venv/bin/twinflow demo $(if $(CONSOLE),--console $(CONSOLE))

# The tests' Spark drivers start from a class-data-sharing archive (the opt-in of
# runtime/spark/session.py, built once per machine in about 45 s): measured to cut the
# suite by minutes, since it starts a JVM for every peer. A stale archive only warns.
SPARK_CDS := .twinflow/spark-cds.jsa
# And write their checkpoint files without forking `chmod` (runtime/spark/local_fs.py), when this
# machine has a JDK's javac to build the jar: the archive is built after it, with it on the class path.
# (The stamp says the jar was built, or could not be: without javac, tests run without it.)
SPARK_JAR := .twinflow/twinflow-spark.jar
SPARK_JAR_STAMP := .twinflow/twinflow-spark.stamp
SPARK_ENV = TWINFLOW_SPARK_JAR=$(abspath $(SPARK_JAR)) TWINFLOW_SPARK_CDS=$(abspath $(SPARK_CDS))

$(SPARK_JAR_STAMP): runtime/spark/NoForkLocalFileSystem.java | bootstrap
	mkdir -p .twinflow && rm -f $(SPARK_JAR)
	if command -v javac >/dev/null 2>&1; then .venv/bin/python -m twinflow.runtime.spark.local_fs $(SPARK_JAR); \
	else echo "make: no javac: Spark's checkpoint files will fork chmod (runtime/spark/local_fs.py)" >&2; fi
	touch $(SPARK_JAR_STAMP)

$(SPARK_CDS): $(SPARK_JAR_STAMP) | bootstrap
	mkdir -p .twinflow && $(SPARK_ENV) .venv/bin/python -m twinflow.runtime.spark.session --build-cds $(SPARK_CDS) \
		>.twinflow/spark-cds.log 2>&1 || { tail -30 .twinflow/spark-cds.log >&2; exit 1; }

test: bootstrap $(SPARK_CDS)
# Three pytest-xdist workers on 2 cores: a cluster test spends much of its time waiting (a
# peer's start, a session's expiry), so a third worker fills that; measured 396 against 465 s
# in pytest, and 475 against 550 s with one core kept busy by another process (docs/performance.md).
	$(SPARK_ENV) .venv/bin/python -m pytest -q -rs --durations=15 -n 3 --dist loadfile

proto: bootstrap
	scripts/gen_proto.sh

bench: bootstrap
	.venv/bin/python bench/failover.py --runs 5
	.venv/bin/python bench/handover.py --runs 5
	.venv/bin/python bench/throughput.py
	.venv/bin/python bench/nodes.py

clean:
	rm -rf .twinflow build dist *.egg-info
