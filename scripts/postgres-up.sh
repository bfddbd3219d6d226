#!/usr/bin/env bash
# Make PostgreSQL's server binaries (initdb, pg_ctl, postgres) available; idempotent.
#
#   bash scripts/postgres-up.sh          # or: make postgres
#
# Nothing is started here: the tests, `make demo-fleet` and `make bench` start their own
# server (initdb + pg_ctl into a temporary dir, on a free port of 127.0.0.1) through
# tests/pgserver.py, and stop it when they end. As root on Debian without the binaries,
# installs Debian's `postgresql` package (its own cluster is not used and stays stopped).
set -euo pipefail

say() { echo "postgres-up: $*" >&2; }

found() {
    [ -n "${BROKER_PG_BIN:-}" ] && [ -x "$BROKER_PG_BIN/initdb" ] && return 0
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && return 0
    command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1
}

if found; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    say "PostgreSQL's server binaries are missing; install PostgreSQL 15 or newer" \
        "(Debian: apt-get install postgresql), or set BROKER_PG_BIN to their directory"
    exit 1
fi
say "installing Debian's postgresql"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends postgresql >/dev/null
# the package starts a cluster of its own on port 5432; the tests never use it
if command -v pg_lsclusters >/dev/null 2>&1; then
    pg_lsclusters --no-header 2>/dev/null | while read -r version name _; do
        pg_ctlcluster "$version" "$name" stop 2>/dev/null || true
    done
fi
found || { say "error: postgresql installed, but initdb is still not found"; exit 1; }
