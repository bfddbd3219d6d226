#!/usr/bin/env bash
# Make Debian's headless Chromium available for the inbox's browser tests; idempotent.
#
#   bash scripts/chromium-up.sh
#
# If $CHROMIUM (default /usr/bin/chromium) already runs, do nothing. Otherwise (as root,
# Debian) run `apt-get update` and install the `chromium` package. Playwright drives this
# binary through executable_path; `playwright install` is never needed.
set -euo pipefail

chromium=${CHROMIUM:-/usr/bin/chromium}

say() { echo "chromium-up: $*" >&2; }
die() { say "error: $*"; exit 1; }
works() { [ -x "$chromium" ] && "$chromium" --headless --no-sandbox --version >/dev/null 2>&1; }

if works; then
    exit 0
fi

[ "$(id -u)" = 0 ] || die "$chromium is missing and installing it needs root (apt-get install chromium)"
command -v apt-get >/dev/null 2>&1 || die "$chromium is missing and this is not a Debian-like system"
say "installing chromium from the configured Debian mirror"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null || die "apt-get update failed"
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null \
    || die "apt-get install chromium failed"
works || die "$chromium does not start after installing it"
say "ready: $("$chromium" --headless --no-sandbox --version 2>/dev/null)"
