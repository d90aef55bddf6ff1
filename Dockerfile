# The worker image (default target) and the Spark jobs' image (--target spark).
# BASE_IMAGE: any Debian bookworm with python3.11 and its venv module; the tests build on a
# debootstrapped stand-in (python -m tools.container base), as no registry is reachable there.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS runtime
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The data dir is the volume; the installed package's own folder (app/settings.py's ROOT)
# belongs to root and is never written at run time.
# uid and gid 10001 both (useradd --user-group would take a system gid, 999).
RUN groupadd --system --gid 10001 pairstream \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/pairstream pairstream \
 && install -d -o pairstream -g pairstream /var/lib/pairstream \
 && python3.11 -m venv /opt/venv
# Dependencies from the lock alone (requirements/, `make lock`), every file checked against
# its hash, so an edit of the source reuses this layer. The worker's only: the Spark jobs'
# (the `analytics` extra) go into the spark target.
COPY requirements/worker.txt /tmp/deps/
RUN pip install --require-hashes -r /tmp/deps/worker.txt && rm -rf /tmp/deps
COPY pyproject.toml README.md /tmp/src/
COPY pairing /tmp/src/pairing
COPY app /tmp/src/app
COPY agents /tmp/src/agents
COPY tables /tmp/src/tables
COPY delivery /tmp/src/delivery
COPY web /tmp/src/web
COPY analytics /tmp/src/analytics
COPY tools /tmp/src/tools
COPY bench /tmp/src/bench
RUN pip install --no-deps /tmp/src && rm -rf /tmp/src
ENV PAIRSTREAM_DATA_DIR=/var/lib/pairstream \
    PAIRSTREAM_LAKE_DIR=/var/lib/pairstream/lake \
    PAIRSTREAM_WEB_HOST=0.0.0.0
VOLUME /var/lib/pairstream
WORKDIR /var/lib/pairstream
USER pairstream

# python -m analytics all|ingest|windows|reconcile [--master spark://...]: the `analytics`
# extra (pyspark, delta-spark, matplotlib), a JRE, and the Delta and Kafka jars, which
# Maven fetches here once and is then removed.
FROM runtime AS spark
USER root
# For Maven's downloads only, e.g. -Djavax.net.ssl.trustStore=... behind a TLS-inspecting proxy.
ARG MAVEN_OPTS=""
COPY requirements/spark.txt /tmp/deps/
RUN pip install --require-hashes -r /tmp/deps/spark.txt \
 && rm -rf /tmp/deps \
 && apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven \
 && python -m analytics jars \
 && apt-get purge -y --auto-remove maven \
 && rm -rf /var/lib/apt/lists/* /root/.m2
USER pairstream
CMD ["python", "-m", "analytics", "all"]

# The worker: no JDK, no jars. Point PAIRSTREAM_BROKER at the cluster and set
# PAIRSTREAM_WEB_CANONICAL_URL=http://<pod ip>:6066 so the other workers reach this one.
FROM runtime AS worker
EXPOSE 6066
# /health answers without data, also when PAIRSTREAM_WEB_TOKEN is set.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('PAIRSTREAM_WEB_PORT', '6066'), timeout=4)"
CMD ["faust", "-A", "app", "worker", "-l", "info"]
