#!/usr/bin/env bash
# Headless Chromium for the report tests (tests/browser.py opens the HTML reports in it), with
# the chromedriver built from the same Chromium release, and a Simplified Chinese font so that
# `--lang zh` reports and their plots show Chinese rather than empty boxes.
# Debian's packages, as root; on another system install Chromium, its driver and a CJK font
# yourself (the tests look for /usr/bin/chromium and /usr/bin/chromedriver).
set -euo pipefail
PACKAGES="chromium chromium-driver fonts-wqy-zenhei"
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && fc-list :lang=zh 2>/dev/null | grep -q .; then
  echo "browser ready: $(/usr/bin/chromium --version 2>/dev/null)"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "error: scripts/setup-browser.sh: needs root and apt-get to install $PACKAGES" >&2
  exit 2
fi
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q $PACKAGES >/dev/null 2>&1 ||
  { apt-get update -q >/dev/null && apt-get install -y -q $PACKAGES >/dev/null; }
echo "browser ready: $(/usr/bin/chromium --version 2>/dev/null)"
