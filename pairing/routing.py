"""Which partition of the keyed topic owns a pairing key.

The ingest agent sends to an explicit partition computed here, so A and B of
one timestamp always meet on the same partition, whatever key the producer
used, and tests can predict where every key lives.
"""

import zlib


def partition_for(key: str, partitions: int) -> int:
    return zlib.crc32(key.encode()) % partitions
