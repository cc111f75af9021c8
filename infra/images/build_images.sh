#!/usr/bin/env bash
# Builds every image docker-compose.yml needs, with no registry:
#   1. a Debian base made with debootstrap from the mirror the host's apt uses, imported into Docker;
#   2. a wheelhouse of the pinned runtime requirements (so image builds need no network);
#   3. the Cellpilot services image and the Kafka-protocol (Tansu), PostgreSQL and Redis images,
#      all from the same wheels the embedded stack uses;
#   4. .env at the repository root pointing docker compose at these local images.
# Usage: infra/images/build_images.sh [--base-image NAME]  (default: the debootstrapped base)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
TAG=${CELLPILOT_IMAGE_TAG:-local}
BASE_IMAGE=${1:-}
if [ "${BASE_IMAGE}" = "--base-image" ]; then BASE_IMAGE=${2:?--base-image needs a name}; fi

step() { printf '\n== %s\n' "$*"; }

if [ -z "${BASE_IMAGE}" ]; then
  BASE_IMAGE="cellpilot/debian-base:bookworm"
  if ! docker image inspect "${BASE_IMAGE}" >/dev/null 2>&1; then
    step "debootstrap a Debian base image (${BASE_IMAGE})"
    if ! command -v debootstrap >/dev/null; then
      apt-get update -qq && apt-get install -y -qq debootstrap
    fi
    read -r MIRROR SUITE < <(python3 infra/images/debian_mirror.py)
    ROOTFS=$(mktemp -d /tmp/cellpilot-rootfs.XXXXXX)
    trap 'rm -rf "${ROOTFS}"' EXIT
    echo "mirror ${MIRROR}, suite ${SUITE}"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,tini,procps \
      "${SUITE}" "${ROOTFS}" "${MIRROR}" > /tmp/cellpilot-debootstrap.log 2>&1 \
      || { tail -20 /tmp/cellpilot-debootstrap.log; exit 1; }
    rm -rf "${ROOTFS}"/var/cache/apt/archives/*.deb "${ROOTFS}"/var/lib/apt/lists/*
    tar -C "${ROOTFS}" -c . | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' - "${BASE_IMAGE}"
  fi
fi

step "wheelhouse from requirements.lock"
mkdir -p infra/images/wheelhouse
"${PY}" -m pip wheel --quiet --wheel-dir infra/images/wheelhouse -r requirements.lock setuptools wheel

for target in services kafka postgres redis; do
  step "image cellpilot/${target}:${TAG} (base ${BASE_IMAGE})"
  docker build --quiet --build-arg "BASE_IMAGE=${BASE_IMAGE}" --target "${target}" \
    -f infra/images/Dockerfile -t "cellpilot/${target}:${TAG}" .
done

cat > .env <<ENV
# Written by make images: docker compose uses these locally built images.
COMPOSE_PROJECT_NAME=cellpilot
CELLPILOT_SERVICES_IMAGE=cellpilot/services:${TAG}
CELLPILOT_KAFKA_IMAGE=cellpilot/kafka:${TAG}
CELLPILOT_POSTGRES_IMAGE=cellpilot/postgres:${TAG}
CELLPILOT_REDIS_IMAGE=cellpilot/redis:${TAG}
ENV
step "done: .env points docker compose at the local images"
