#!/usr/bin/env bash
# Issue 23's reliability check: N consecutive `make test` runs of a clean clone of REV,
# each beside two CPU-bound Python busy loops; one line per run in OUT, stop at the
# first red run. Usage: scripts/load-runs.sh [REV=HEAD] [N=10] [OUT=load-runs.txt]
set -u
REV=$(git rev-parse "${1:-HEAD}")
N=${2:-10}
OUT=$(realpath "${3:-load-runs.txt}")
CLONE=$(mktemp -d /tmp/load-runs.XXXXXX)
chmod 755 "$CLONE"  # so the rootless Podman user can reach it and those tests run too
git clone -q "$(git rev-parse --show-toplevel)" "$CLONE" && git -C "$CLONE" checkout -q "$REV"
python3 -c "while True: pass" & B1=$!
python3 -c "while True: pass" & B2=$!
trap 'kill $B1 $B2 2>/dev/null' EXIT
for i in $(seq 1 "$N"); do
  start=$(date +%s)
  (cd "$CLONE" && make test) > "$CLONE/run-$i.log" 2>&1
  rc=$?
  summary=$(grep -E "passed|failed" "$CLONE/run-$i.log" | tail -1)
  echo "run $i rev ${REV:0:7} rc=$rc $(( $(date +%s) - start ))s load=$(cut -d' ' -f1-3 /proc/loadavg) $(date -u +%FT%TZ) :: $summary" >> "$OUT"
  [ "$rc" -ne 0 ] && { echo "red run: $CLONE/run-$i.log"; exit 1; }
done
