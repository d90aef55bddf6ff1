"""All configuration, in one place. Every field can be set by an environment
variable named PAIRSTREAM_<FIELD> (e.g. PAIRSTREAM_EXPIRY_SECONDS=120)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from pairing.rules import MICROS, PairingConfig

ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PAIRSTREAM_", frozen=True)

    # Kafka
    app_id: str = Field(
        "pairstream", description="Faust app id: consumer group and prefix of internal topics"
    )
    broker: str = Field(
        "kafka://127.0.0.1:9092",
        description="Kafka bootstrap servers, kafka://host:port[;host:port]",
    )
    events_topic: str = "events"
    events_partitions: int = Field(
        8, ge=1, description="partitions of the input topic: created so, or checked at start"
    )
    keyed_topic: str = Field("events-by-timestamp", description="events re-keyed by pairing key")
    pairs_topic: str = "pairs"
    unpaired_topic: str = "unpaired"
    dead_letter_topic: str = "events.dlq"
    partitions: int = Field(
        4, ge=1, description="partitions of the keyed topic and of the state changelogs"
    )
    replication_factor: int = Field(1, ge=1)

    # Pairing rules
    expiry_seconds: float = Field(300.0, gt=0, description="event-time expiry of a pending event")
    max_wait_seconds: float | None = Field(
        None,
        gt=0,
        description="wall-clock expiry while the watermark stands still; default = expiry",
    )
    dedup_retention_seconds: float = Field(
        3600.0, gt=0, description="event time an identity is remembered after its expiry"
    )
    idle_timeout_seconds: float = Field(
        30.0,
        gt=0,
        description="an input partition caught up and quiet this long stops holding the"
        " watermark back",
    )
    max_event_bytes: int = Field(65536, gt=0)
    tick_interval_seconds: float = Field(
        10.0, gt=0, description="how often quiet partitions check max wait and idleness"
    )

    # Processing
    commit_interval_seconds: float = Field(0.5, gt=0, description="how often a transaction commits")
    session_timeout_seconds: float = Field(
        10.0, gt=0, description="how soon the group notices a dead worker and rebalances"
    )
    metadata_refresh_seconds: float = Field(
        10.0,
        gt=0,
        description="how often a worker refreshes cluster metadata: a subscribed topic it did"
        " not see at its assignment (just created) is picked up within this time",
    )
    transaction_timeout_seconds: float = Field(
        60.0, gt=0, description="the broker aborts a transaction left open this long"
    )
    standby_replicas: int = Field(0, ge=0, description="warm copies of each table partition")
    data_dir: Path = Field(ROOT / ".run" / "worker", description="RocksDB state and worker files")
    web_port: int = Field(6066, description="this worker's stats, metrics and dashboard")
    web_host: str = Field("127.0.0.1", description="interface the web server binds to")
    web_canonical_url: str | None = Field(
        None, description="URL other workers reach this one at; default http://web_host:web_port"
    )
    debug: bool = Field(
        False, description="also serve faust's raw table dumps (/table), graph and sensor pages"
    )

    # Analytics (Spark jobs)
    lake_dir: Path = Field(ROOT / ".run" / "lake", description="Delta tables and checkpoints")
    spark_master: str = Field("local[*]", description="local[*], or spark://host:port")
    spark_driver_memory: str = "1g"
    ingest_max_records_per_batch: int = Field(
        100_000, gt=0, description="records per topic per ingest batch (a Delta commit)"
    )
    tumbling_window_seconds: int = Field(60, gt=0)
    hopping_window_seconds: int = Field(300, gt=0)
    hopping_slide_seconds: int = Field(60, gt=0)
    sliding_window_seconds: int = Field(300, gt=0, description="look-back of a sliding window")
    session_gap_seconds: int = Field(60, gt=0, description="event-time silence closing a session")

    @property
    def pairing(self) -> PairingConfig:
        return PairingConfig(
            expiry_us=int(self.expiry_seconds * MICROS),
            max_wait_s=self.max_wait_seconds or self.expiry_seconds,
            dedup_retention_us=int(self.dedup_retention_seconds * MICROS),
        )

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.removeprefix("kafka://").replace(";", ",")


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings()
