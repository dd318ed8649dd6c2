#!/usr/bin/env bash
# Runs lint and the test suite. pytest's exit code 5 ("no tests collected") is reported and treated as a failure
# only when a test path was given explicitly; the full suite always collects tests.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
.venv/bin/ruff check plait tests || exit 1
.venv/bin/mypy || exit 1
.venv/bin/python -m pytest -q -n "${PLAIT_TEST_WORKERS:-2}" --durations=25 "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "run-tests: pytest collected no tests for: ${*:-tests}" >&2
  [ $# -gt 0 ] && exit 5
  exit 1
fi
exit $rc
