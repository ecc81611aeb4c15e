#!/bin/sh
# First start: initdb with POSTGRES_PASSWORD (scram), create POSTGRES_DB; then run in the foreground.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pw=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}" > "$pw"
  initdb -D "$PGDATA" -U postgres --pwfile="$pw" --encoding=UTF8 --locale=C.UTF-8 --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pw"
  echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ]; then
    postgres -D "$PGDATA" -c listen_addresses='' &
    until pg_isready -q -h /var/run/postgresql; do sleep 0.2; done
    createdb -h /var/run/postgresql -U postgres "$POSTGRES_DB"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
