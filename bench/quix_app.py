"""The peer: the benchmark's pairing work as a Quix Streams app, exactly-once.

Run by bench/quix.py with the Python of its own venv (quixstreams and nothing of
pairstream): `python bench/quix_app.py BOOTSTRAP INPUT OUTPUT GROUP COMMIT_S STATE_DIR`.

The same work per event as pairstream's two stages, without event time: parse the
JSON once, check the type and timestamp, repartition by the timestamp (the pair key),
then one state read and one state write per event in RocksDB with a
changelog, and a pair record out when A meets B (with the A's id, as pairstream's).
Duplicates and a second A are kept out as pairstream keeps them. No expiry:
pairstream's max wait and watermarks cost it more than this app pays.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import Any

from quixstreams import Application, State
from quixstreams.models.topics.exceptions import TopicNotFoundError

PAIRED = "paired"
SETUP_ATTEMPTS = 3


def checked(value: dict[str, Any]) -> dict[str, Any]:
    if value.get("type") not in ("A", "B"):
        raise ValueError(f"not an A/B event: {value!r}")
    datetime.fromisoformat(value["timestamp"])
    float(value["value"])
    return value


def pair(value: dict[str, Any], state: State) -> dict[str, Any] | None:
    pending = state.get("pending")
    if pending is None:
        state.set("pending", value)
        return None
    if pending["type"] in (value["type"], PAIRED):
        state.set("pending", pending)  # a duplicate or a conflict: the first one stays
        return None
    state.set("pending", {"type": PAIRED})  # a copy sent again later pairs no second time
    a, b = (pending, value) if pending["type"] == "A" else (value, pending)
    # The A's id, as pairstream's pair carries it: how bench/latency.py knows the pair.
    return {"timestamp": a["timestamp"], "a": a["value"], "b": b["value"], "a_id": a.get("id")}


def build(
    bootstrap: str, source: str, sink: str, group: str, commit_s: str, state_dir: str
) -> Application:
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        commit_interval=float(commit_s),
        processing_guarantee="exactly-once",
        state_dir=state_dir,
        loglevel="WARNING",
    )
    events = app.dataframe(app.topic(source, value_deserializer="json"))
    events = events.apply(checked)
    events = events.group_by(lambda value: value["timestamp"], name="pair-key")
    pairs = events.apply(pair, stateful=True).filter(lambda result: result is not None)
    pairs.to_topic(app.topic(sink, value_serializer="json"))
    return app


def main(*args: str) -> None:
    for attempt in range(1, SETUP_ATTEMPTS + 1):
        try:
            app = build(*args)
            break
        except TopicNotFoundError:
            # Quix looks a topic up right after creating it; a loaded broker may not
            # show it yet (seen in a smoke run beside the fault matrix). Nothing has
            # been consumed by then.
            if attempt == SETUP_ATTEMPTS:
                raise
            time.sleep(1)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:])
