"""Keyed records go where the Java client and aiokafka would put them."""

from __future__ import annotations

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
