"""Settings that reach faust's configuration."""

from app.faust_app import app
from app.settings import settings


def test_the_consumer_refreshes_metadata_as_configured() -> None:
    # faust's default (5 minutes) left a worker that missed a just-created topic
    # without its partitions for that long.
    refresh_ms = settings().metadata_refresh_seconds * 1000
    assert app.conf.consumer_metadata_max_age_ms == refresh_ms < 5 * 60 * 1000
