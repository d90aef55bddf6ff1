"""Partitions added to the input topic while the worker runs join the watermark
(docs/event-time.md): every look, the worker asks the broker for the cluster's
metadata; when the input has grown, the input partitions it owns tell every keyed
partition how many sources there now are (the new ones then hold the watermark until
their owners are heard from), the source-progress changelog grows like the input, and
the group joins again, which assigns the new partitions (app/exactly_once/input_partitions.py).
"""

from __future__ import annotations

import logging

from faust.exceptions import ConsumerNotStarted

from agents.ingest import EVENT_TIME, LOOK_EVERY_SECONDS
from app.exactly_once import internals
from app.exactly_once.input_partitions import grow
from app.faust_app import app
from app.kafka.access import progress_changelog
from app.settings import settings
from pairing.watermarks import SourceProgress, WatermarkUpdate

conf = settings()
log = logging.getLogger(__name__)


@app.timer(interval=LOOK_EVERY_SECONDS)
async def look_for_new_input_partitions() -> None:
    try:
        found = await internals.refreshed_partitions(app.consumer, conf.events_topic)
    except ConsumerNotStarted:
        return  # not joined yet: it takes the count it starts with from the broker
    before = app.input_size.count
    if not app.input_size.grew_to(found):
        return
    log.warning(
        "input topic %s has grown from %d to %d partitions: they join the watermark",
        conf.events_topic,
        before,
        app.input_size.count,
    )
    # From here every watermark record ingest sends says so too. A growth that fails
    # (no ALTER on the changelog) crashes the worker; its next start grows it.
    await tell_sources(app.input_size.count)
    await grow(conf, progress_changelog(conf), app.input_size.count)
    # The consumer sees the changelog grown: the group joins again (the leader's look
    # sees it, if it is not this worker), and the new input partitions are assigned
    # with their changelog partitions.
    await internals.refreshed_partitions(app.consumer, conf.events_topic)


async def tell_sources(sources: int) -> None:
    """Each input partition owned here tells every keyed partition that the input has
    `sources` partitions, outside any transaction: no progress (what the keyed
    partitions know of it stays), and idle as its owner last told them."""
    for task in list(app.partition_tasks):
        if task.tp.topic != conf.events_topic:
            continue
        source = task.loaded(SourceProgress)
        if source is None:
            continue  # its first tell will carry the new count
        update = WatermarkUpdate(task.tp.partition, sources, None, source.idle)
        for topic, key, value, partition in EVENT_TIME.records(update):
            await app.producer.send(topic, key, value, partition, None, None)
