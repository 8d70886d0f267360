#!/usr/bin/env bash
# akter workflows beside DBOS workflows on its Postgres queue, one invocation, one server (issue 15).
#
#   bench/workflows_run.sh                        # what docs/benchmarks.md reports: 3-5 minutes
#   RUNS=400 COUNT_RUNS=50 bench/workflows_run.sh # quick look, about 1.5 minutes
#   bench/workflows_run.sh --url postgresql://postgres@127.0.0.1:5432/test   # another server
#   bench/workflows_run.sh --rotate 1             # DBOS first
#
# Creates the peers' virtualenv bench/.venv-peers from the shared harness's pinned requirements
# (/work/shared/bench/requirements.txt, or PEERS_REQUIREMENTS) if it is missing, as
# bench/jobs_run.sh does (the two scripts share it). Then runs bench/workflows.py with akter's
# .venv. Extra arguments go to bench/workflows.py.
# Output: bench/results/workflows-<UTC>.md (the table) and .jsonl (one JSON line per side).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
PEERS=${PEERS:-bench/.venv-peers}
PEERS_REQUIREMENTS=${PEERS_REQUIREMENTS:-/work/shared/bench/requirements.txt}
RUNS=${RUNS:-2000}            # timed runs per side
COUNT_RUNS=${COUNT_RUNS:-200} # runs per wire-count sample (statements, round trips)

if [ ! -x "$PEERS/bin/python" ]; then
  python3 -m venv "$PEERS"
  printf '# created by bench/workflows_run.sh: keep this virtualenv out of git\n*\n' >"$PEERS/.gitignore"
  "$PEERS/bin/pip" install -q -r "$PEERS_REQUIREMENTS"
fi

STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/workflows-$STAMP
mkdir -p bench/results
{
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(nproc) CPUs, $(free -g | awk '/Mem:/{print $2}') GiB RAM, kernel $(uname -r)"
  echo "cpu: $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
  echo "python: $($PY --version 2>&1); peers: $("$PEERS/bin/pip" list 2>/dev/null \
    | grep -iE '^(dbos|psycopg|psycopg-pool|sqlalchemy) ' | tr -s ' ' | paste -sd ';')"
  echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee -a "$OUT.md"

$PY -P bench/workflows.py --runs "$RUNS" --count-runs "$COUNT_RUNS" \
  --peers-python "$PEERS/bin/python" --json "$OUT.jsonl" "$@" | tee -a "$OUT.md"

echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg); wall time: ${SECONDS}s" | tee -a "$OUT.md"
echo "results: $OUT.md, $OUT.jsonl"
