#!/usr/bin/env bash
# Idempotent set-up of the docker backend: docker.io and debootstrap, a running engine, the node image.
# `make setup BACKEND=docker` (or PULSAR_CHAOS_BACKEND=docker make setup) and `make docker-image` run it;
# so do the docker tests. A second run with nothing changed takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKERD_LOG=${PULSAR_CHAOS_DOCKERD_LOG:-/var/log/pulsar-chaos-dockerd.log}

die() { echo "error: $1 (fix: $2)" >&2; exit 2; }

[ "$(id -u)" -eq 0 ] || die "the docker backend's set-up needs root (apt-get, dockerd)" "run it as root: sudo make setup BACKEND=docker"

# one set-up at a time on this host (parallel test workers each ask for the image): the others wait
# for it, then find everything in place
LOCK=/run/lock/pulsar-chaos-docker-setup.lock
mkdir -p "$(dirname "$LOCK")"
exec 8>"$LOCK"
flock -w 1800 8 || die "another set-up has held $LOCK for 30 minutes" "see which process holds it (fuser $LOCK) and end it, then rerun"

# ---- packages
need=()
for p in docker.io debootstrap; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
# a docker engine installed otherwise (docker-ce) will do
if command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1; then
  need=("${need[@]/docker.io}")
fi
need=($(printf '%s\n' "${need[@]}" | grep -v '^$' || true))
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# ---- the engine
if ! docker info >/dev/null 2>&1; then
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    echo "starting docker (systemctl start docker)"
    systemctl start docker || true
  fi
fi
if ! docker info >/dev/null 2>&1; then
  pid=$(cat /var/run/docker.pid 2>/dev/null || true)
  if [ -n "$pid" ] && [ -d "/proc/$pid" ] && grep -q dockerd "/proc/$pid/comm" 2>/dev/null; then
    echo "dockerd (pid $pid) is starting; waiting for it"
  else
    echo "starting dockerd (log: $DOCKERD_LOG)"
    mkdir -p "$(dirname "$DOCKERD_LOG")"
    # 8>&-: the engine outlives this script and must not inherit (and so keep) the set-up lock
    setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null 8>&- &
  fi
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  if ! docker info >/dev/null 2>&1; then
    tail -15 "$DOCKERD_LOG" >&2 || true
    die "the docker engine did not come up within 60s; see $DOCKERD_LOG" "fix what the log says, then rerun make setup BACKEND=docker"
  fi
fi
echo "docker engine $(docker info --format '{{.ServerVersion}}') is running"

# ---- the node image
exec clusters/deploy/images/build.sh
