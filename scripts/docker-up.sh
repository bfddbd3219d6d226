#!/usr/bin/env bash
# Make a Docker engine available on this machine; safe to run any number of times.
#
#   bash scripts/docker-up.sh
#
# If `docker info` already answers, do nothing. Otherwise (as root) install Debian's
# docker.io (and debootstrap, for sandbox_images/build-base.sh) when dockerd or the
# client is missing, start dockerd in the background (log: $DOCKERD_LOG, default
# /tmp/dockerd.log) and wait up to $DOCKER_UP_TIMEOUT seconds (default 60).
#
# Sandboxes run with network_mode=none and the image builds without network, so by
# default dockerd starts with no bridge and no iptables rules: that works on kernels
# without netfilter and leaves the host's firewall alone. Override with DOCKERD_FLAGS.
set -euo pipefail

log=${DOCKERD_LOG:-/tmp/dockerd.log}
timeout=${DOCKER_UP_TIMEOUT:-60}
flags=${DOCKERD_FLAGS:---bridge=none --iptables=false --ip6tables=false}
pidfile=/var/run/docker.pid

say() { echo "docker-up: $*" >&2; }
die() { say "error: $*"; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
answers() { docker info >/dev/null 2>&1; }
running() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

if have docker && answers; then
    exit 0
fi

if ! have dockerd || ! have docker; then
    [ "$(id -u)" = 0 ] || die "Docker is not installed and installing it needs root (apt-get install docker.io)"
    have apt-get || die "Docker is not installed and this is not a Debian-like system; install Docker by hand"
    say "installing docker.io from the configured Debian mirror"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null \
        || die "apt-get install docker.io debootstrap failed"
    answers && exit 0
fi

if ! running; then
    [ "$(id -u)" = 0 ] || die "dockerd is not running and starting it needs root"
    say "starting dockerd $flags (log: $log)"
    # shellcheck disable=SC2086  # flags is a word list on purpose
    nohup dockerd $flags >>"$log" 2>&1 </dev/null &
    started=$!
else
    started=$(cat "$pidfile")
fi

deadline=$((SECONDS + timeout))
while [ "$SECONDS" -lt "$deadline" ]; do
    if answers; then
        say "engine ready: Docker $(docker info --format '{{.ServerVersion}}, storage {{.Driver}}' 2>/dev/null)"
        exit 0
    fi
    if ! kill -0 "$started" 2>/dev/null; then
        tail -n 20 "$log" >&2 || true
        die "dockerd exited at start; see $log"
    fi
    sleep 0.5
done
tail -n 20 "$log" >&2 || true
die "dockerd did not answer within ${timeout}s; see $log"
