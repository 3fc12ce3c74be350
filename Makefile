# The two commands: `make demo` and `make test`. Both install what is missing first.
.PHONY: demo test bootstrap proto bench services-up services-down clean

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	.venv/bin/twinflow demo

# The tests' Spark drivers start from a class-data-sharing archive (the opt-in of
# runtime/spark/session.py, built once per machine in about 45 s): measured to cut the
# suite by minutes, since it starts a JVM for every peer. A stale archive only warns.
SPARK_CDS := .twinflow/spark-cds.jsa

$(SPARK_CDS): | bootstrap
	mkdir -p .twinflow && .venv/bin/python -m twinflow.runtime.spark.session --build-cds $(SPARK_CDS) >.twinflow/spark-cds.log 2>&1 \
		|| { tail -30 .twinflow/spark-cds.log >&2; exit 1; }

test: bootstrap $(SPARK_CDS)
	TWINFLOW_SPARK_CDS=$(abspath $(SPARK_CDS)) .venv/bin/python -m pytest -q -rs --durations=15 -n 2 --dist loadfile

proto: bootstrap
	scripts/gen_proto.sh

bench: bootstrap
	.venv/bin/python bench/failover.py --runs 5
	.venv/bin/python bench/handover.py --runs 5
	.venv/bin/python bench/throughput.py
	.venv/bin/python bench/nodes.py

clean:
	rm -rf .twinflow build dist *.egg-info
