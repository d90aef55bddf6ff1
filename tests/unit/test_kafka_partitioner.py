"""Keyed records go where the Java client and aiokafka would put them."""

from __future__ import annotations

import os
import time

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from app.kafka.partitioner import default_partition, murmur2

# org.apache.kafka.common.utils.UtilsTest.testMurmur2 (signed 32-bit, as Java has them).
JAVA = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_the_java_client_s_hashes() -> None:
    assert {key: murmur2(key) - (murmur2(key) >> 31 << 32) for key in JAVA} == JAVA


@given(st.binary(max_size=300))  # past the 256 bytes of the kept readers
def test_the_same_hash_as_aiokafka_s(key: bytes) -> None:
    assert murmur2(key) == aiokafka_murmur2(key)


@given(st.binary(min_size=1, max_size=40), st.integers(1, 64))
def test_the_same_partition_as_aiokafka_s(key: bytes, count: int) -> None:
    partitions = list(range(count))
    assert default_partition(key, partitions) == DefaultPartitioner()(key, partitions, [])


def hash_seconds(key: bytes) -> float:
    """The least of three timings: what the hashing costs, not what the host did meanwhile."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        murmur2(key)
        best = min(best, time.perf_counter() - start)
    return best


def test_hashing_is_linear_in_the_key_s_length() -> None:
    """A key of 1 MB costs about 16 times one of 64 KB, not 256 (a hash left unmasked over
    the whole key grew with it: 500 KB took 21.8 s). A ratio, so that it holds on a slow
    host as on a fast one; docs/grammar.md gives the figures."""
    small, large = hash_seconds(os.urandom(65_536)), hash_seconds(os.urandom(1_048_576))
    assert large / small < 48, (small, large)
    assert murmur2(b"\x00" * 1_048_576) == aiokafka_murmur2(b"\x00" * 1_048_576)
