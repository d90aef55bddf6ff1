"""State declarations: changelog-backed RocksDB tables of raw bytes, which our own
codecs write and read, and whose changelog records go into the event's transaction."""

from __future__ import annotations

from typing import Any

from app.faust_app import app


def bytes_table(name: str, partitions: int) -> Any:
    return app.Table(
        name,
        partitions=partitions,
        key_type=bytes,
        value_type=bytes,
        options={"driver": "rocksdict"},
    )
