# One image for workers and Spark jobs: Python 3.11 + JDK 17.
# Not built in this repo's CI (no Docker engine there); kept in step with the Makefile.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless build-essential maven \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/pairstream
COPY pyproject.toml README.md ./
COPY pairing ./pairing
COPY app ./app
COPY agents ./agents
COPY tables ./tables
COPY analytics ./analytics
COPY tools ./tools
# Editable, so ROOT (app/settings.py) is this folder: Spark's jars go to .cache/ here.
RUN pip install --no-cache-dir -e . \
 && python -m analytics jars

ENV PAIRSTREAM_DATA_DIR=/var/lib/pairstream \
    PAIRSTREAM_WEB_HOST=0.0.0.0
VOLUME /var/lib/pairstream
EXPOSE 6066

# Point PAIRSTREAM_BROKER at your cluster: -e PAIRSTREAM_BROKER=kafka://broker:9092
# and tell other workers where this one is: -e PAIRSTREAM_WEB_CANONICAL_URL=http://<pod ip>:6066
# Spark jobs from the same image: docker run IMAGE python -m analytics all [--master spark://…]
CMD ["faust", "-A", "app", "worker", "-l", "info"]
