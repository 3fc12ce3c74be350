# The two commands: `make demo` and `make test`. Both install what is missing first.
.PHONY: demo test bootstrap proto bench services-up services-down clean

bootstrap:
	@scripts/bootstrap.sh

demo: bootstrap
	.venv/bin/twinflow demo

test: bootstrap
	.venv/bin/python -m pytest -q -rs --durations=15 -n 2 --dist loadfile

proto: bootstrap
	scripts/gen_proto.sh

bench: bootstrap
	.venv/bin/python bench/failover.py --runs 5
	.venv/bin/python bench/handover.py --runs 5
	.venv/bin/python bench/throughput.py
	.venv/bin/python bench/nodes.py

clean:
	rm -rf .twinflow build dist *.egg-info
