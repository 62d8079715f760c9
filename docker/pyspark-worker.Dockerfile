# The reference PySpark worker (kgroup_pipeline): Python 3.11, pyspark and a JRE 17.
#   docker build -f docker/pyspark-worker.Dockerfile -t ghcr.io/kgroup/kgroup-pyspark-worker:0.1.0 .
# Spark needs a writable scratch dir (SPARK_LOCAL_DIRS) and a HOME for ivy; both point at
# /tmp, which the pod mounts as an emptyDir when the root filesystem is read-only.
# Holds the core (kgroup/) and the pipeline only, with the `pipeline` extra's packages
# (pyspark, redis, pyarrow, pandas): no kopf, kubernetes client, operator or sidecar code.
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    JAVA_HOME=/usr/lib/jvm/java-17-openjdk \
    SPARK_LOCAL_DIRS=/tmp/spark \
    HOME=/tmp

# Debian bookworm's headless JRE 17 (pinned to bookworm: trixie no longer ships openjdk-17).
# The slim base leaves man pages out (dpkg path-exclude), yet the JRE's postinst registers
# an alternative for java.1.gz there and fails without /usr/share/man/man1.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive \
    apt-get install --yes --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17-openjdk

WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY kgroup ./kgroup
COPY pipeline ./pipeline
RUN pip install --constraint constraints.txt ".[pipeline]" && rm -rf /src

WORKDIR /tmp
RUN groupadd --system --gid 10001 kgroup \
 && useradd --system --uid 10001 --gid kgroup --home-dir /nonexistent --shell /usr/sbin/nologin kgroup
USER 10001:10001

# No entrypoint: the Deployment names the worker module to run (see examples/).
CMD ["python3"]
