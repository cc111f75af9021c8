#!/usr/bin/env bash
# The browser `make test` needs: the dashboard's page tests drive the system's headless Chromium
# with Playwright (tests/integration/dashboard/chromium_page.py), which downloads no browser of
# its own: this script is how a fresh machine gets one.
#
# When no Chromium is on PATH, installs it with the system's package manager (Debian and Ubuntu:
# apt-get install chromium; Fedora: dnf; Alpine: apk), through sudo when not root. When that is
# not possible it prints ONE line saying why and what to do, writes the same line to
# test-artifacts/chromium-missing.txt, and exits 0: the rest of the suite still runs and the
# browser tests fail with that line (they never skip silently).
set -uo pipefail
cd "$(dirname "$0")/../.."
ARTIFACTS=${CELLPILOT_ARTIFACTS_DIR:-test-artifacts}
STATUS="$ARTIFACTS/chromium-missing.txt"
LOG="$ARTIFACTS/chromium-install.log"
mkdir -p "$ARTIFACTS"
rm -f "$STATUS"

have_chromium() {
  command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 ||
    command -v google-chrome >/dev/null 2>&1
}

cannot() {
  local line="Chromium is missing and could not be installed ($1): $2; the dashboard browser tests will fail."
  echo "$line" | tee "$STATUS" >&2
  exit 0
}

have_chromium && exit 0

if [ "$(id -u)" = 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  # A terminal may answer sudo's password prompt; CI (no terminal) must not hang on it.
  if [ -t 0 ]; then as_root=(sudo); else as_root=(sudo -n); fi
else
  cannot "not root and no sudo" "install the chromium package as root"
fi

if command -v apt-get >/dev/null 2>&1; then
  package=chromium
  command="apt-get install chromium"
  echo "Installing Chromium for the dashboard browser tests: ${as_root[*]} $command (log: $LOG)"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >"$LOG" 2>&1
  if ! apt-cache show chromium >/dev/null 2>&1 && apt-cache show chromium-browser >/dev/null 2>&1; then
    package=chromium-browser  # Ubuntu's name
  fi
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "$package" >>"$LOG" 2>&1
elif command -v dnf >/dev/null 2>&1; then
  command="dnf install chromium"
  echo "Installing Chromium for the dashboard browser tests: ${as_root[*]} $command (log: $LOG)"
  "${as_root[@]}" dnf install -y -q chromium >"$LOG" 2>&1
elif command -v apk >/dev/null 2>&1; then
  command="apk add chromium"
  echo "Installing Chromium for the dashboard browser tests: ${as_root[*]} $command (log: $LOG)"
  "${as_root[@]}" apk add --no-cache chromium >"$LOG" 2>&1
else
  cannot "no apt-get, dnf or apk on this system" "install Chromium (or Chrome) so that 'chromium' is on PATH"
fi

have_chromium || cannot "'${as_root[*]} $command' failed, see $LOG" "run it yourself, then make test again"
echo "Chromium installed: $(command -v chromium || command -v chromium-browser || command -v google-chrome)"
