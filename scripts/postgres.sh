#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for the tuner's shared studies (tests, one-host runs).
#
#   bash scripts/postgres.sh start DIR PORT   # initdb in DIR (if new), serve 127.0.0.1:PORT, print the URL
#   bash scripts/postgres.sh stop DIR [PORT]  # fast shutdown
#   bash scripts/postgres.sh url DIR PORT     # the URL: postgresql+psycopg://postgres@127.0.0.1:PORT/msa_tune
#
# Trust authentication on loopback only (listen_addresses=127.0.0.1, no TCP from elsewhere): for a
# multi-host run, set up a real server instead (docs/multi-gpu-tuning.md). PostgreSQL refuses to
# run as root, so as root the server runs as the `postgres` user (created by Debian's package).
# The binaries: Debian's postgresql package (/usr/lib/postgresql/<version>/bin), or PG_BIN=DIR.
set -euo pipefail

usage() { echo "usage: $0 start|stop|url DIR PORT" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)
port=${3:-5432}
db=msa_tune
url="postgresql+psycopg://postgres@127.0.0.1:${port}/${db}"

pg_bin() {
  if [ -n "${PG_BIN:-}" ]; then echo "$PG_BIN"; return; fi
  local found
  found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$found" ] && [ -x "$found/initdb" ]; then echo "$found"; return; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  echo "postgres.sh: no PostgreSQL server binaries (apt-get install -y postgresql, or set PG_BIN)" >&2
  exit 1
}

# as_pg CMD...: run as the server's owner (postgres when we are root, else ourselves)
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    if command -v runuser >/dev/null 2>&1; then runuser -u postgres -- "$@"; else su postgres -s /bin/sh -c "$(printf '%q ' "$@")"; fi
  else
    "$@"
  fi
}

case "$cmd" in
  start)
    bin=$(pg_bin)
    if [ "$(id -u)" = 0 ]; then
      id postgres >/dev/null 2>&1 || { echo "postgres.sh: running as root needs a 'postgres' user" >&2; exit 1; }
      chown postgres "$dir"
      chmod 700 "$dir"
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
      as_pg "$bin/initdb" -D "$dir/data" -U postgres -A trust -E UTF8 --no-sync >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    fi
    # Enough connections for many workers (each holds a small pool and a heartbeat thread);
    # fsync off: this server is for tests and throwaway runs.
    as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start \
      -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=off" >/dev/null \
      || { tail -n 30 "$dir/server.log" >&2; exit 1; }
    if ! as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc \
        "select 1 from pg_database where datname = '$db'" | grep -q 1; then
      as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres "$db"
    fi
    echo "$url"
    ;;
  stop)
    bin=$(pg_bin)
    if [ -f "$dir/data/postmaster.pid" ]; then
      as_pg "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null || true
    fi
    ;;
  url)
    echo "$url"
    ;;
  *)
    usage
    ;;
esac
