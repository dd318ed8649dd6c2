# Two entry points for a fresh machine: `make bench` (the benchmark on the default device) and `make test`.
.PHONY: setup test bench lint

setup:
	@tools/setup.sh

test: setup
	@tools/run-tests.sh

bench: setup
	@.venv/bin/plait bench --quick --out bench-results

lint: setup
	.venv/bin/ruff check plait tests benchmarks tools examples
	.venv/bin/ruff format --check plait tests benchmarks tools examples
	.venv/bin/mypy
