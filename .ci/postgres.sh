#!/usr/bin/env bash
# Start a throw-away PostgreSQL server on loopback for the multi-worker sweep test.
# Prints the URL on stdout; installs Debian's postgresql first when it is missing.
set -euo pipefail
port=${ARBENCH_PG_PORT:-$(python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")}
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
fi
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
data=$(mktemp -d /tmp/arbench-pg.XXXXXX)
chown postgres "$data"
as_pg() { if [ "$(id -u)" = 0 ]; then su postgres -s /bin/sh -c "$*"; else sh -c "$*"; fi; }
as_pg "$bin/initdb -D $data -A trust -U postgres >/dev/null"
as_pg "$bin/pg_ctl -D $data -o '-k $data -p $port -h 127.0.0.1' -l $data/log -w start >/dev/null"
as_pg "$bin/createdb -h 127.0.0.1 -p $port -U postgres arbench"
echo "$data" > /tmp/arbench-pg.datadir
echo "postgresql://postgres@127.0.0.1:$port/arbench"
