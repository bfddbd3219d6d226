#!/usr/bin/env bash
# What bench/native (the C prototype of the accept path) needs to build: gcc, SQLite's
# and OpenSSL's headers, and valgrind for its instruction counts. Debian's packages,
# installed as root when absent; says what is missing otherwise.
set -euo pipefail
need=()
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
[ -f /usr/include/sqlite3.h ] || need+=(libsqlite3-dev)
[ -f /usr/include/openssl/evp.h ] || need+=(libssl-dev)
command -v valgrind >/dev/null || need+=(valgrind)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "bench/native needs: ${need[*]} (apt-get install them as root)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}"
