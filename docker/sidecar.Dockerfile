# The kgroup sidecar (one per worker pod; its API listens on 127.0.0.1 only).
#   docker build -f docker/sidecar.Dockerfile -t ghcr.io/kgroup/kgroup-sidecar:0.1.0 .
# The chart's probes start no interpreter: httpGet on the pod's IP, or (hostNetwork pods)
# `find` on the sidecar's probe files (GNU findutils, in every Debian image).
# Holds the core (kgroup/) and the sidecar only, with the `sidecar` extra's packages
# (aiohttp, prometheus-client, python-json-logger, PyYAML, and pydantic from the core,
# which the sidecar does not import): no kubernetes client, kopf, operator, pipeline or
# dev-cluster code.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY kgroup ./kgroup
COPY worker_sidecar ./worker_sidecar
RUN pip install --constraint constraints.txt ".[sidecar]" && rm -rf /src

WORKDIR /
RUN groupadd --system --gid 10001 kgroup \
 && useradd --system --uid 10001 --gid kgroup --home-dir /nonexistent --shell /usr/sbin/nologin kgroup
USER 10001:10001

EXPOSE 8470
ENTRYPOINT ["kgroup-sidecar"]
