#!/usr/bin/env bash
# Local Citus 13.2.x test cluster on PostgreSQL 15 (for `make test-citus`).
#   coordinator 127.0.0.1:9700, workers 127.0.0.1:9701, 127.0.0.1:9702
#   trust auth, database "test", extension citus on every node.
#
# Usage: bench/citus_cluster.sh [setup|build|init|start|stop|status]
#   setup (default): build -> init -> start (every step is skipped if already done)
#   start: start the 3 nodes (initdb first if needed) and make sure db/extension/nodes exist
#   stop:  stop the 3 nodes
set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PG_CONFIG=${PG_CONFIG:-$PGBIN/pg_config}
GIT_DIR=${CITUS_GIT_DIR:-/work/.mirror/citusdata+citus/repo}
SRC=${CITUS_SRC:-/tmp/citus-src}
BASE=${CITUS_CLUSTER_DIR:-/tmp/citus-cluster}
HOST=127.0.0.1
COORD_PORT=9700
WORKER_PORTS=(9701 9702)
ALL_PORTS=($COORD_PORT "${WORKER_PORTS[@]}")
DB=test
PGUSER_OS=postgres           # postgres refuses to run as root

log() { echo "[citus-cluster] $*" >&2; }

# run a command as the postgres OS user when we are root
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u "$PGUSER_OS" -- "$@"; else "$@"; fi
}

psql_at() { # port db sql...
  local port=$1 db=$2; shift 2
  PGOPTIONS="-c client_min_messages=warning" "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$port" -U postgres -d "$db" -Atc "$*"
}

latest_tag() {
  git --git-dir="$GIT_DIR" tag -l 'v13.2.*' | sort -V | tail -1
}

# Patch: Citus 13.2.x defines a PG15-only `static inline have_createdb_privilege()` in
# src/include/pg_version_compat.h, but PostgreSQL 15.20 now exports
# `extern bool have_createdb_privilege(void)` from commands/dbcommands.h
# -> "static declaration follows non-static declaration". Keep the static
# fallback only for PG15 < 15.20 and otherwise declare the server's function.
patch_src() {
  local f=$SRC/src/include/pg_version_compat.h
  grep -q 'citus-cluster.sh patch' "$f" && return 0
  log "build: patching $f (have_createdb_privilege)"
  python3 - "$f" <<'PYEOF'
import sys, re
p = sys.argv[1]
s = open(p).read()
pat = re.compile(r'\nstatic inline bool\nhave_createdb_privilege\(void\)\n\{.*?\n\}\n', re.S)
m = pat.search(s)
assert m, "have_createdb_privilege definition not found"
repl = ("\n/* citus-cluster.sh patch: PG 15.20 exports have_createdb_privilege() */\n"
        "#if PG_VERSION_NUM < 150020" + m.group(0) +
        "#else\nextern bool have_createdb_privilege(void);\n#endif\n")
s = s[:m.start()] + repl + s[m.end():]
open(p, "w").write(s)
PYEOF
}

do_build() {
  local tag pkglib
  tag=$(latest_tag)
  [ -n "$tag" ] || { log "no v13.2.x tag in $GIT_DIR"; exit 1; }
  pkglib=$("$PG_CONFIG" --pkglibdir)
  if [ -f "$SRC/.installed-$tag" ] && [ -f "$pkglib/citus.so" ]; then
    log "build: citus $tag already installed, skipping"
    return
  fi
  [ "$(id -u)" = 0 ] || { log "build/install needs root (writes to $pkglib)"; exit 1; }
  if [ ! -f "$SRC/.extracted-$tag" ]; then
    log "build: extracting $tag into $SRC"
    rm -rf "$SRC"; mkdir -p "$SRC"
    git --git-dir="$GIT_DIR" archive "$tag" | tar -x -C "$SRC"
    touch "$SRC/.extracted-$tag"
  fi
  patch_src
  # gssapi/gssapi.h: required, because Debian's PG15 is built --with-gssapi and
  #   server/libpq/libpq-be.h includes it (postgresql-server-dev-15 here lacks libkrb5-dev)
  # lz4.h / zstd.h: optional, columnar compression
  # postgres.h: the server headers themselves (postgresql-server-dev-<major>), absent on a
  #   machine that has only the server and libpq-dev
  local server_inc
  server_inc=$("$PG_CONFIG" --includedir-server)
  if ! [ -f "$server_inc/postgres.h" ] && command -v apt-get >/dev/null; then
    local major
    major=$("$PG_CONFIG" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "postgresql-server-dev-$major" || true
  fi
  if ! [ -f /usr/include/gssapi/gssapi.h ] || ! [ -f /usr/include/lz4.h ] || ! [ -f /usr/include/zstd.h ]; then
    if command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q libkrb5-dev liblz4-dev libzstd-dev || true
    fi
  fi
  local extra=()
  [ -f /usr/include/lz4.h ] || extra+=(--without-lz4)
  [ -f /usr/include/zstd.h ] || extra+=(--without-zstd)
  cd "$SRC"
  if [ ! -f Makefile.global ]; then
    log "build: configure ${extra[*]:-}"
    nice -n 19 ./configure PG_CONFIG="$PG_CONFIG" --without-libcurl "${extra[@]}"
  fi
  # with_llvm=no: skip LLVM bitcode (JIT inlining) -> roughly halves build time
  log "build: make -j2 (niced)"
  nice -n 19 make -j2 with_llvm=no
  nice -n 19 make install with_llvm=no
  touch "$SRC/.installed-$tag"
}

do_init() {
  mkdir -p "$BASE"
  [ "$(id -u)" = 0 ] && chown "$PGUSER_OS": "$BASE"
  local port d
  for port in "${ALL_PORTS[@]}"; do
    d=$BASE/$port
    if [ -f "$d/PG_VERSION" ]; then log "init: $d exists, skipping"; continue; fi
    log "init: initdb $d"
    as_pg "$PGBIN/initdb" -D "$d" -U postgres --auth=trust --encoding=UTF8 --locale=C.UTF-8 >"$BASE/initdb-$port.log"
    cat >>"$d/postgresql.conf" <<EOF

# ---- citus test cluster ----
port = $port
listen_addresses = '127.0.0.1'
unix_socket_directories = '$BASE'
shared_preload_libraries = 'citus'
max_prepared_transactions = 100
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
  done
}

is_running() { as_pg "$PGBIN/pg_ctl" -D "$BASE/$1" status >/dev/null 2>&1; }

do_start() {
  do_init
  local port
  for port in "${ALL_PORTS[@]}"; do
    if is_running "$port"; then log "start: $port already running"; continue; fi
    log "start: node $port"
    as_pg "$PGBIN/pg_ctl" -D "$BASE/$port" -l "$BASE/$port.log" -w -t 60 start >/dev/null
  done
  for port in "${ALL_PORTS[@]}"; do
    if [ "$(psql_at "$port" postgres "select count(*) from pg_database where datname='$DB'")" = 0 ]; then
      psql_at "$port" postgres "create database $DB"
    fi
    psql_at "$port" "$DB" "create extension if not exists citus"
  done
  psql_at $COORD_PORT "$DB" "select citus_set_coordinator_host('$HOST', $COORD_PORT)" >/dev/null
  for port in "${WORKER_PORTS[@]}"; do
    if [ "$(psql_at $COORD_PORT "$DB" "select count(*) from pg_dist_node where nodename='$HOST' and nodeport=$port")" = 0 ]; then
      log "start: citus_add_node $HOST:$port"
      psql_at $COORD_PORT "$DB" "select citus_add_node('$HOST', $port)" >/dev/null
    fi
  done
  do_status
}

do_stop() {
  local port
  for port in "${ALL_PORTS[@]}"; do
    if [ -f "$BASE/$port/PG_VERSION" ] && is_running "$port"; then
      log "stop: node $port"
      as_pg "$PGBIN/pg_ctl" -D "$BASE/$port" -m fast -w stop >/dev/null
    fi
  done
}

do_status() {
  local port
  for port in "${ALL_PORTS[@]}"; do
    if [ -f "$BASE/$port/PG_VERSION" ] && is_running "$port"; then
      echo "node $port: running, citus $(psql_at "$port" "$DB" "select extversion from pg_extension where extname='citus'" 2>/dev/null || echo '?')"
    else
      echo "node $port: stopped"
    fi
  done
  if is_running $COORD_PORT 2>/dev/null; then
    echo "active workers: $(psql_at $COORD_PORT "$DB" "select string_agg(node_name||':'||node_port, ' ' order by node_port) from citus_get_active_worker_nodes()")"
  fi
}

case "${1:-setup}" in
  setup)  do_build; do_start ;;
  build)  do_build ;;
  init)   do_init ;;
  start)  do_start ;;
  stop)   do_stop ;;
  status) do_status ;;
  *) echo "usage: $0 [setup|build|init|start|stop|status]" >&2; exit 2 ;;
esac
