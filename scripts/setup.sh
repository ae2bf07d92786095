#!/usr/bin/env bash
# Idempotent set-up for pulsar-chaos: system packages, then a Python 3.11 virtualenv at .venv.
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium + chromium-driver: the headless browser of the `pulsar-chaos serve` test (tests/serve/)
APT_PACKAGES=(zookeeper default-jre-headless iproute2 iptables procps libfuse2 fuse3 faketime chromium chromium-driver)

need=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
# Java may already come from another package (any JRE on PATH will do).
if command -v java >/dev/null 2>&1; then
  need=("${need[@]/default-jre-headless}")
fi
need=($(printf '%s\n' "${need[@]}" | grep -v '^$' || true))
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: missing system packages: ${need[*]} (fix: run 'make setup' as root, or apt-get install ${need[*]})" >&2
    exit 2
  fi
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

PY=""
for c in python3.11 python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)'; then
    PY=$(command -v "$c"); break
  fi
done
if [ -z "$PY" ]; then
  echo "error: Python 3.11 not found (fix: install python3.11)" >&2
  exit 2
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  echo "installing Python packages into .venv (log: .venv/pip-install.log)"
  if ! { .venv/bin/pip install --upgrade pip && .venv/bin/pip install -e '.[dev,analysis,serve]'; } > .venv/pip-install.log 2>&1; then
    tail -20 .venv/pip-install.log >&2
    echo "error: pip install failed; see .venv/pip-install.log (fix: check network access to PyPI, then rerun make setup)" >&2
    exit 2
  fi
  rm -f .venv/.installed-*
  touch "$stamp"
fi
echo "setup complete: .venv ready, ZooKeeper $(dpkg-query -W -f='${Version}' zookeeper)"
