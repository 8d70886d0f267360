#!/usr/bin/env bash
# akter's job executor beside Procrastinate and DBOS queues, one invocation, one server (issue 4).
#
#   bench/jobs_run.sh                      # what docs/benchmarks.md reports: 8-12 minutes
#   JOBS=2000 JOBS_OTHER=1000 COUNT_JOBS=300 bench/jobs_run.sh    # quick look, about 4 minutes
#   bench/jobs_run.sh --url postgresql://postgres@127.0.0.1:5432/test   # another server
#
# Creates the peers' virtualenv bench/.venv-peers from the shared harness's pinned requirements
# (/work/shared/bench/requirements.txt, or PEERS_REQUIREMENTS) if it is missing; a `.gitignore`
# containing `*` inside it keeps it out of git, as newer `python -m venv` does by itself. Then runs
# bench/jobs.py with akter's .venv. Extra arguments go to bench/jobs.py.
# Output: bench/results/jobs-<UTC>.md (the tables) and .jsonl (one JSON line per side and run).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
PEERS=${PEERS:-bench/.venv-peers}
PEERS_REQUIREMENTS=${PEERS_REQUIREMENTS:-/work/shared/bench/requirements.txt}
JOBS=${JOBS:-20000}            # no-op jobs in the "noop" scenario
JOBS_OTHER=${JOBS_OTHER:-4000} # jobs in "capped", "sleep32" and "sleep64"
COUNT_JOBS=${COUNT_JOBS:-500}  # jobs per wire-count sample (statements, round trips)

if [ ! -x "$PEERS/bin/python" ]; then
  python3 -m venv "$PEERS"
  printf '# created by bench/jobs_run.sh: keep this virtualenv out of git\n*\n' >"$PEERS/.gitignore"
  "$PEERS/bin/pip" install -q -r "$PEERS_REQUIREMENTS"
fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/jobs-$STAMP
mkdir -p bench/results
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB RAM, kernel $(uname -r)"
  echo "cpu: $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
  echo "python: $($PY --version 2>&1); peers: $("$PEERS/bin/pip" list 2>/dev/null \
    | grep -iE '^(procrastinate|dbos|psycopg|psycopg-pool|sqlalchemy) ' | tr -s ' ' | paste -sd ';')"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$OUT.md"

$PY -P bench/jobs.py --jobs "$JOBS" --jobs-other "$JOBS_OTHER" --count-jobs "$COUNT_JOBS" \
  --peers-python "$PEERS/bin/python" --json "$OUT.jsonl" "$@" | tee -a "$OUT.md"

echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); wall time: ${SECONDS}s" | tee -a "$OUT.md"
echo "results: $OUT.md, $OUT.jsonl"
