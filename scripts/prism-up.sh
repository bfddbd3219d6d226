#!/usr/bin/env bash
# Install Prism and GitHub's OpenAPI description for the GitHub handler's tests; idempotent.
#
#   bash scripts/prism-up.sh          # or: make prism
#
# Installs pinned versions with npm into $PRISM_DIR (default .tools/prism/, gitignored):
#   @stoplight/prism-cli  5.14.2   the last release that runs on Node 18/20 (5.15+ need Node 24)
#   @octokit/openapi      23.0.2   GitHub's official REST description:
#                                  node_modules/@octokit/openapi/generated/api.github.com.json
# Prism's own packages are pinned with npm overrides, so a newer release of one of them
# cannot slip in. Nothing is started here: tests/effects/test_github.py starts
# `prism mock` once per test session, on a free port of 127.0.0.1.
#
# Needs node >= 18.20 and npm. As root on Debian without them, installs Debian's nodejs
# and npm first. A second run with everything in place does nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
dir=${PRISM_DIR:-.tools/prism}
prism_version=5.14.2
openapi_version=23.0.2

say() { echo "prism-up: $*" >&2; }
die() { say "error: $*"; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }
installed() {
    local pkg=$1 want=$2 file="$dir/node_modules/$1/package.json"
    [ -f "$file" ] && [ "$(node -p "require('./$file').version" 2>/dev/null)" = "$want" ]
}
ready() {
    installed @stoplight/prism-cli "$prism_version" \
        && installed @octokit/openapi "$openapi_version" \
        && [ -x "$dir/node_modules/.bin/prism" ] \
        && [ -s "$dir/node_modules/@octokit/openapi/generated/api.github.com.json" ]
}

if ! have node || ! have npm; then
    [ "$(id -u)" = 0 ] || die "node and npm are missing; install Node.js >= 18.20 (with npm)"
    have apt-get || die "node and npm are missing and this is not a Debian-like system"
    say "installing nodejs and npm from the configured Debian mirror"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null \
        || die "apt-get install nodejs npm failed"
fi
node -e 'const [a, b] = process.versions.node.split(".").map(Number);
         process.exit(a > 18 || (a === 18 && b >= 20) ? 0 : 1)' \
    || die "Prism $prism_version needs Node.js >= 18.20; this is $(node --version)"

if ready; then
    exit 0
fi

mkdir -p "$dir"
cat >"$dir/package.json" <<EOF
{
  "name": "broker-test-tools-prism",
  "private": true,
  "description": "Installed by scripts/prism-up.sh for tests/effects/test_github.py",
  "dependencies": {
    "@stoplight/prism-cli": "$prism_version",
    "@octokit/openapi": "$openapi_version"
  },
  "overrides": {
    "@stoplight/prism-core": "5.8.0",
    "@stoplight/prism-http": "5.12.0",
    "@stoplight/prism-http-server": "5.12.2"
  }
}
EOF
say "installing @stoplight/prism-cli@$prism_version and @octokit/openapi@$openapi_version into $dir"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error >/dev/null \
    || die "npm install failed (see the npm log above)"
ready || die "the install finished but $dir is incomplete"
say "ready: $("$dir/node_modules/.bin/prism" --version) with GitHub's description in $dir"
