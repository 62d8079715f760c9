# The kgroup operator (kopf). Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/kgroup/kgroup-operator:0.1.0 .
# Runs as a non-root user with a read-only root filesystem (the chart mounts /tmp).
# Holds the core (kgroup/) and the operator only, with the `operator` extra's packages
# (kopf, aiohttp, orjson, prometheus-client, python-json-logger, cryptography, jsonpatch,
# pydantic): no kubernetes client (the operator talks to the API server over aiohttp,
# kgroup/apiclient.py), no sidecar, pipeline or dev-cluster code.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY kgroup ./kgroup
COPY operator ./operator
# `pip install .` builds the one distribution (kgroup) from the directories copied above,
# pinned by constraints.txt; the source tree is removed afterwards.
RUN pip install --constraint constraints.txt ".[operator]" && rm -rf /src

WORKDIR /
RUN groupadd --system --gid 10001 kgroup \
 && useradd --system --uid 10001 --gid kgroup --home-dir /nonexistent --shell /usr/sbin/nologin kgroup
USER 10001:10001

ENTRYPOINT ["kgroup-operator"]
