"""Settings that reach faust's configuration."""

from app.faust_app import app
from app.settings import settings


def test_the_consumer_refreshes_metadata_as_configured() -> None:
    # faust's default (5 minutes) left a worker that missed a just-created topic
    # without its partitions for that long.
    refresh_ms = settings().metadata_refresh_seconds * 1000
    assert app.conf.consumer_metadata_max_age_ms == refresh_ms < 5 * 60 * 1000


def test_the_producer_lingers_as_configured() -> None:
    # faust's default (0) sends each record in a produce request of its own.
    assert app.conf.producer_linger == settings().producer_linger_seconds > 0


def test_fetches_bring_little_per_partition() -> None:
    # faust's 1 MiB per partition: a backlog's fetch kept the pairing stage waiting
    # until ingest had worked through it (no pairing output for the first 50 s).
    assert app.conf.consumer_max_fetch_size == settings().fetch_bytes_per_partition < 2**20
