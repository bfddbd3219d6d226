#!/usr/bin/env bash
# Make Podman usable on this machine, rootful and rootless; safe to run any number of times.
#
#   bash scripts/podman-up.sh            (prints nothing more when all is in place)
#   eval "$(bash scripts/podman-up.sh --env)"   (exports CONTAINERS_CONF for this shell)
#
# Podman has no daemon: "up" means the binaries, a containers.conf that works here, and
# an unprivileged user for rootless runs. As root, when absent, it installs Debian's
# podman with catatonit (the pause process `podman kube play` pods need), runc, uidmap
# (newuidmap/newgidmap for rootless user namespaces) and debootstrap (the agent image's
# base is built from Debian packages: no image registry is reachable here).
#
# Why a containers.conf of our own ($PODMAN_CONF, default /etc/sandbox-broker/containers.conf,
# handed to podman through CONTAINERS_CONF by the broker and the tests):
#   [containers] default_ulimits = []   podman 4.3 sets RLIMIT_NPROC etc. by default, and
#                                       this machine forbids it ("setrlimit RLIMIT_NPROC:
#                                       Operation not permitted"): no container would start.
#   [engine] runtime = "runc"           crun (Debian's default) refuses the hybrid cgroup
#                                       v1 layout of this machine; runc accepts it.
#   [engine] cgroup_manager = "cgroupfs" there is no systemd here to own the cgroups.
#
# Rootless: user $PODMAN_USER (default broker-rootless, created when absent) with a
# subordinate uid/gid range in /etc/subuid and /etc/subgid (its user namespace), and
# a storage.conf choosing native overlay. Checked with `podman unshare` as that user;
# the result is printed, and a failure there is not fatal (the rootless tests skip
# and say why).
set -euo pipefail

conf=${PODMAN_CONF:-/etc/sandbox-broker/containers.conf}
user=${PODMAN_USER:-broker-rootless}

say() { echo "podman-up: $*" >&2; }
die() { say "error: $*"; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

if [ "${1:-}" = "--env" ]; then
    echo "export CONTAINERS_CONF=$conf"
    exit 0
fi

missing=()
for tool in podman catatonit runc newuidmap debootstrap; do
    have "$tool" || [ -x "/usr/libexec/podman/$tool" ] || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    [ "$(id -u)" = 0 ] || die "missing ${missing[*]}; installing them needs root"
    have apt-get || die "missing ${missing[*]} and this is not a Debian-like system"
    say "installing podman catatonit runc uidmap debootstrap from the configured Debian mirror"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends podman catatonit runc uidmap \
        debootstrap conmon containernetworking-plugins >/dev/null \
        || die "apt-get install podman catatonit runc uidmap debootstrap failed"
fi

if [ ! -s "$conf" ] || ! grep -q 'default_ulimits = \[\]' "$conf"; then
    [ "$(id -u)" = 0 ] || [ -w "$(dirname "$conf")" ] || die "cannot write $conf"
    mkdir -p "$(dirname "$conf")"
    cat >"$conf" <<'CONF'
# Written by scripts/podman-up.sh: see its header for why each line is here.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
    chmod 0644 "$conf"
    say "wrote $conf"
fi
export CONTAINERS_CONF=$conf

if ! podman info >/dev/null 2>&1; then
    podman info 2>&1 | tail -n 5 >&2 || true
    die "podman info fails with CONTAINERS_CONF=$conf"
fi

# The rootless user: best effort, reported, never fatal.
if [ "$(id -u)" = 0 ]; then
    if ! id "$user" >/dev/null 2>&1; then
        useradd --create-home --shell /bin/sh --comment "sandbox-broker rootless podman" "$user" \
            || say "cannot create user $user"
    fi
    if id "$user" >/dev/null 2>&1; then
        for f in /etc/subuid /etc/subgid; do
            touch "$f"
            grep -q "^$user:" "$f" || echo "$user:200000:65536" >>"$f"
        done
        uid=$(id -u "$user")
        mkdir -p "/run/user/$uid" && chown "$user:" "/run/user/$uid" && chmod 0700 "/run/user/$uid"
        # Native overlay for the user's store (kernels >= 5.13 allow it in a user
        # namespace): without it Podman falls back to vfs, which copies the whole image
        # for every container (about 14 s a sandbox here instead of about 2).
        home=$(getent passwd "$user" | cut -d: -f6)
        store="$home/.config/containers/storage.conf"
        if [ ! -s "$store" ]; then
            runuser -u "$user" -- mkdir -p "$home/.config/containers"
            printf '[storage]\ndriver = "overlay"\n' >"$store"
            chown "$user:" "$store"
        fi
        if runuser -u "$user" -- env -i PATH="$PATH" HOME="$home" XDG_RUNTIME_DIR="/run/user/$uid" \
            CONTAINERS_CONF="$conf" podman unshare true 2>/dev/null; then
            rootless="rootless user $user ready"
        else
            rootless="rootless user $user: podman unshare fails (the rootless tests will say why)"
        fi
    fi
fi
say "ready: $(podman --version), CONTAINERS_CONF=$conf; ${rootless:-rootless user not set up (not root)}"
