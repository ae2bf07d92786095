#!/usr/bin/env bash
# Build the docker backend's node image without a registry; idempotent.
#
#   1. base: debootstrap a bookworm minbase with packages.txt (cached as a tarball under
#      $PULSAR_CHAOS_IMAGE_CACHE, default /var/cache/pulsar-chaos) and `docker import` it as
#      pulsar-chaos-base:<key of packages.txt, suite and mirror>;
#   2. node: `docker build` ./Dockerfile with BASE=that image on a context inputs.py stages (our
#      sources, the host's extra CA certs), tagged pulsar-chaos-node:<hash of the inputs> and :latest.
#
# Skipped when pulsar-chaos-node:<hash> exists. After a source change only the layers from the
# sources on are rebuilt (docker's layer cache; the dependencies' layer depends on pyproject.toml).
# Needs root, a running docker engine, debootstrap (first build only) and network access to a Debian
# mirror ($PULSAR_CHAOS_DEBIAN_MIRROR) and PyPI. scripts/docker-setup.sh provides the first three.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
SUITE=bookworm
MIRROR=${PULSAR_CHAOS_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${PULSAR_CHAOS_IMAGE_CACHE:-/var/cache/pulsar-chaos}
IMAGE=pulsar-chaos-node
BASE_IMAGE=pulsar-chaos-base
BASE_RECIPE=1            # bump when the debootstrap recipe below changes: a new base is built
KEEP_TAGS=3              # pulsar-chaos-node:<hash> tags older than the newest 3 and than
PRUNE_AGE_S=86400        #   a day are removed
export DOCKER_BUILDKIT=0 # the classic builder: the same on docker 20.10 and later, no buildx needed

die() { echo "error: $1 (fix: $2)" >&2; exit 2; }
elapsed() { echo $(( $(date +%s) - t0 )); }
t0=$(date +%s)

[ "$(id -u)" -eq 0 ] || die "building the node image needs root (debootstrap, docker)" "run it as root: sudo make docker-image"
command -v docker >/dev/null || die "docker not found" "run 'make setup BACKEND=docker' (it installs docker.io)"
docker info >/dev/null 2>&1 || die "no docker engine answers 'docker info'" "run 'make setup BACKEND=docker' (it starts dockerd)"
PY=""
for c in "$REPO/.venv/bin/python" python3.11 python3; do
  if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    PY=$c; break
  fi
done
[ -n "$PY" ] || die "Python 3.11 not found (inputs.py needs tomllib)" "install python3.11, or run 'make setup' first"

mkdir -p "$CACHE"
exec 9>"$CACHE/build.lock"
flock 9                  # one build at a time (make, tests); the second finds the image built

hash=$("$PY" "$HERE/inputs.py" hash "$REPO")
if docker image inspect "$IMAGE:$hash" >/dev/null 2>&1; then
  docker tag "$IMAGE:$hash" "$IMAGE:latest"
  echo "$IMAGE:$hash is up to date"
  exit 0
fi

# ---- 1. the base image, from a cached debootstrap tarball
pkgs=$(grep -v '^#' "$HERE/packages.txt" | grep -v '^[[:space:]]*$' | paste -sd, -)
base_key=$(printf '%s\n' "$BASE_RECIPE" "$SUITE" "$MIRROR" "$pkgs" | sha256sum | cut -c1-12)
base="$BASE_IMAGE:$base_key"
tarball="$CACHE/debootstrap-$SUITE-$base_key.tar"
if ! docker image inspect "$base" >/dev/null 2>&1; then
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || die "debootstrap not found" "run 'make setup BACKEND=docker' (it installs debootstrap)"
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs" "$tarball.tmp"' EXIT
    echo "debootstrapping $SUITE with $pkgs from $MIRROR (log: $CACHE/debootstrap.log)"
    if ! debootstrap --variant=minbase --include="$pkgs" "$SUITE" "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1; then
      tail -15 "$CACHE/debootstrap.log" >&2
      die "debootstrap failed; see $CACHE/debootstrap.log" "check access to $MIRROR (or set PULSAR_CHAOS_DEBIAN_MIRROR), then rerun"
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
           "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
    trap - EXIT
    echo "debootstrap done: $tarball ($(du -h "$tarball" | cut -f1), $(elapsed)s)"
  fi
  docker import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' "$tarball" "$base" >/dev/null
  echo "imported $base ($(elapsed)s)"
fi

# ---- 2. the node image
ctx=$(mktemp -d "${TMPDIR:-/tmp}/pulsar-chaos-image.XXXXXX")
trap 'rm -rf "$ctx"' EXIT
hash=$("$PY" "$HERE/inputs.py" stage "$ctx" "$REPO")    # the hash of exactly what was staged
echo "building $IMAGE:$hash on $base (log: $CACHE/build.log)"
if ! docker build --build-arg BASE="$base" --build-arg INPUTS="$hash" \
      -t "$IMAGE:$hash" -t "$IMAGE:latest" "$ctx" >"$CACHE/build.log" 2>&1; then
  tail -25 "$CACHE/build.log" >&2
  die "docker build failed; see $CACHE/build.log" "check access to PyPI from containers, then rerun 'make docker-image'"
fi

# forget old builds: beyond the newest few, those a day old (a build of other sources shares all
# but its last layers, ~2 MB; a test session may still pin a recent one; rmi refuses an image in use)
now=$(date +%s)
docker images "$IMAGE" --format '{{.Tag}}' | { grep -vx -e latest -e "$hash" || true; } | tail -n +"$KEEP_TAGS" |
  while read -r tag; do
    created=$(date -d "$(docker image inspect -f '{{.Created}}' "$IMAGE:$tag")" +%s 2>/dev/null || echo "$now")
    if [ $(( now - created )) -gt "$PRUNE_AGE_S" ]; then docker rmi "$IMAGE:$tag" >/dev/null 2>&1 || true; fi
  done
docker image prune -f --filter label=pulsar-chaos.image=node >/dev/null 2>&1 || true
echo "built $IMAGE:$hash ($(docker image inspect -f '{{.Size}}' "$IMAGE:$hash" | awk '{printf "%d MB", $1/1e6}')) in $(elapsed)s"
