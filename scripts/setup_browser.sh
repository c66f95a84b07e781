#!/usr/bin/env bash
# Installs what the `browser` tests need (tests/train/test_report_browser.py: mas-report's page in a real browser):
# Debian's headless-capable Chromium from apt (root; `apt-get update` first) and playwright's Python package in the
# project venv, which drives that Chromium through `executable_path` (no `playwright install`, no browser download).
#     scripts/setup_browser.sh                  # venv at .venv in the repository root
#     VENV=/path/to/venv scripts/setup_browser.sh
# Then: .venv/bin/python -m pytest -m browser (MAS_CHROMIUM overrides the browser path, default /usr/bin/chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
if ! command -v chromium >/dev/null; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq chromium >/dev/null
fi
"$VENV/bin/pip" install -q -c constraints/cpu.txt -e ".[browser]"
chromium --version
"$VENV/bin/python" -c "import importlib.metadata as m; print('playwright', m.version('playwright'))"
