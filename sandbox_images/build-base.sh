#!/usr/bin/env bash
# Build a minimal Debian base image with python3 from Debian packages, for machines
# that cannot pull python:3.12-slim from a registry.
#
#   bash sandbox_images/build-base.sh [TAG]      (default TAG: broker-base:bookworm)
#
# Uses debootstrap (minbase) against the Debian mirror this machine's apt already
# uses, then `$ENGINE import` (ENGINE: docker, the default, or podman). Reuses TAG when
# it exists unless FORCE=1.
# Env: SUITE (default bookworm), MIRROR (default: from /etc/apt/sources.list*), ENGINE.
set -euo pipefail

tag=${1:-broker-base:bookworm}
suite=${SUITE:-bookworm}
engine=${ENGINE:-docker}

say() { echo "build-base: $*" >&2; }
die() { say "error: $*"; exit 1; }

if [ "${FORCE:-0}" != 1 ] && "$engine" image inspect "$tag" >/dev/null 2>&1; then
    say "$tag exists; reusing it (FORCE=1 rebuilds)"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "debootstrap needs root"
if ! command -v debootstrap >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "debootstrap is missing and there is no apt-get"
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap \
        >/dev/null || die "apt-get install debootstrap failed"
fi

# The first main-archive Debian mirror that apt is configured with (deb822 or one-line).
configured_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && awk '/^URIs:/ { for (i = 2; i <= NF; i++) print $i }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] && awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; break } }' "$f"
    done
    return 0
}

mirror=${MIRROR:-$(configured_mirror | grep -E '/debian/?$' | head -n 1 || true)}
[ -n "$mirror" ] || die "no Debian mirror found in /etc/apt/sources.list*; set MIRROR"

root=$(mktemp -d /tmp/broker-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
# mktemp's 0700 would become the image's "/": a rootless Podman store (vfs) keeps it,
# and then no uid but the container's root can even find /bin/sh.
chmod 0755 "$root"

say "debootstrap $suite from $mirror"
start=$SECONDS
debootstrap --variant=minbase --include=python3,python3-venv,python-is-python3 \
    "$suite" "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -n 20 "$root.log" >&2; die "debootstrap failed; log in $root.log"; }
rm -f "$root.log"

# Nothing in the sandbox needs apt's caches, docs or the device nodes debootstrap made.
rm -rf "${root:?}"/var/cache/apt/archives/*.deb "${root:?}"/var/lib/apt/lists/* \
    "${root:?}"/usr/share/doc/* "${root:?}"/usr/share/man/* "${root:?}"/usr/share/locale/* \
    "${root:?}"/dev/* "${root:?}"/proc/* "${root:?}"/sys/*

tar -C "$root" --numeric-owner -c . \
    | "$engine" import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        --message "debootstrap $suite minbase + python3 from $mirror" \
        - "$tag" >/dev/null
say "built $tag in $((SECONDS - start))s"
