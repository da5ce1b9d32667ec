#!/usr/bin/env bash
# Install the system packages the browser tests need (Debian/Ubuntu only):
#   chromium        headless browser for screenshot / click tests (/usr/bin/chromium)
#   fonts-noto-cjk  so Chinese tokens render in screenshots (installed if available)
#
# We use the distribution's chromium, not Playwright's own browser download
# (`playwright install`), which needs hosts a closed network cannot reach.
#
# Idempotent and quick when everything is already there. Without root or
# password-less sudo, or without apt-get, it only prints what to install.
# Failures are fatal under CI (CI=true) and a warning otherwise, so `make test`
# on a laptop still runs the tests that need no browser.
set -euo pipefail

want=()
[ -x /usr/bin/chromium ] || want+=(chromium)
if command -v dpkg-query >/dev/null 2>&1; then
    dpkg-query -W -f='${Status}' fonts-noto-cjk 2>/dev/null | grep -q 'install ok installed' \
        || want+=(fonts-noto-cjk)
fi
[ ${#want[@]} -eq 0 ] && exit 0

fail() {
    echo "NOTE: $*" >&2
    echo "NOTE: browser tests will be skipped or fail until these are installed:" >&2
    echo "NOTE:     apt-get update && apt-get install -y ${want[*]}" >&2
    if [ "${CI:-}" = "true" ]; then exit 1; fi
    exit 0
}

if ! command -v apt-get >/dev/null 2>&1; then
    fail "no apt-get here; install Chromium yourself (tests look for /usr/bin/chromium)."
fi
if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    fail "not root and no password-less sudo: cannot install ${want[*]}."
fi

export DEBIAN_FRONTEND=noninteractive
echo "Installing system packages: ${want[*]}"
"${SUDO[@]}" apt-get update -qq || fail "apt-get update failed."
# fonts-noto-cjk is optional: install it only if this distribution has it.
pkgs=()
for p in "${want[@]}"; do
    if [ "$p" = fonts-noto-cjk ] && ! apt-cache show fonts-noto-cjk >/dev/null 2>&1; then
        echo "NOTE: fonts-noto-cjk not available here; Chinese text may show as boxes in screenshots." >&2
        continue
    fi
    pkgs+=("$p")
done
[ ${#pkgs[@]} -eq 0 ] && exit 0
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${pkgs[@]}" \
    || fail "apt-get install ${pkgs[*]} failed."
if [ ! -x /usr/bin/chromium ]; then fail "chromium installed but /usr/bin/chromium is missing."; fi
echo "System packages ready: $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
