"""OffsetFetch version 7 with `require_stable` (KIP-447), which aiokafka 0.14 does not
send (it stops at version 3): the broker then answers UNSTABLE_OFFSET_COMMIT for a
partition whose transaction has committed but whose offsets are not visible yet (its
markers still being written), instead of the offsets committed before it. A look-up in
that window read offsets one transaction old, and the records after them were processed
again (docs/faust-gaps.md, 23). Schemas: Kafka's OffsetFetchRequest.json and
OffsetFetchResponse.json, version 7 (flexible)."""

from __future__ import annotations

from typing import Any, ClassVar

from aiokafka import errors
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.commit import OffsetFetchResponse_v3
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

API_KEY = 9
UNSTABLE_OFFSET_COMMIT = 88


class UnstableOffsetCommitError(errors.BrokerResponseError):  # type: ignore[misc]
    """A transaction's offsets are committed but not visible yet: ask again."""

    errno = UNSTABLE_OFFSET_COMMIT
    message = "UNSTABLE_OFFSET_COMMIT"
    description = "There are unstable offsets that need to be cleared."
    retriable = True


class OffsetFetchResponse_v7(Response):  # type: ignore[misc]  # aiokafka: untyped
    API_KEY = API_KEY
    API_VERSION = 7
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                (
                    "partitions",
                    CompactArray(
                        ("partition_index", Int32),
                        ("committed_offset", Int64),
                        ("committed_leader_epoch", Int32),
                        ("metadata", CompactString("utf-8")),
                        ("error_code", Int16),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("error_code", Int16),
        ("tags", TaggedFields),
    )


class OffsetFetchRequest_v7(RequestStruct):  # type: ignore[misc]
    FLEXIBLE_VERSION = True
    API_KEY = API_KEY
    API_VERSION = 7
    RESPONSE_TYPE = OffsetFetchResponse_v7
    SCHEMA = Schema(
        ("group_id", CompactString("utf-8")),
        (
            "topics",
            CompactArray(
                ("name", CompactString("utf-8")),
                ("partition_indexes", CompactArray(Int32)),
                ("tags", TaggedFields),
            ),
        ),
        ("require_stable", Boolean),
        ("tags", TaggedFields),
    )


class StableOffsetFetchRequest(Request[OffsetFetchRequest_v7]):  # type: ignore[misc]
    """A look-up of the committed offsets of `partitions` ((topic, [partition]) pairs)
    that waits for transactions being committed. Brokers before Kafka 2.5 do not take
    version 7: the request then fails to build, and the worker does not start."""

    API_KEY: ClassVar[int] = API_KEY

    def __init__(self, group_id: str, partitions: list[tuple[str, list[int]]]) -> None:
        self._group_id = group_id
        self._partitions = partitions

    def build(self, request_struct_class: type[OffsetFetchRequest_v7]) -> OffsetFetchRequest_v7:
        topics: list[tuple[str, list[int], dict[int, bytes]]] = [
            (topic, partitions, {}) for topic, partitions in self._partitions
        ]
        return request_struct_class(self._group_id, topics, True, {})


def as_version_3(response: OffsetFetchResponse_v7) -> Any:
    """The answer as the version-3 response aiokafka's group coordinator reads; raises
    the group-level error (aiokafka reads only the partitions' errors;
    docs/faust-gaps.md, 22), and
    UnstableOffsetCommitError, which aiokafka retries as it retries a coordinator
    still loading, if any partition's offsets are not visible yet."""
    if response.error_code:
        raise errors.for_code(response.error_code)()
    topics: list[tuple[str, list[tuple[int, int, str | None, int]]]] = []
    for name, partitions, _ in response.topics:
        read = []
        for partition, offset, _epoch, metadata, code, _ in partitions:
            if code == UNSTABLE_OFFSET_COMMIT:
                raise UnstableOffsetCommitError(f"{name}[{partition}]")
            read.append((partition, offset, metadata, code))
        topics.append((name, read))
    return OffsetFetchResponse_v3(response.throttle_time_ms, topics, response.error_code)
