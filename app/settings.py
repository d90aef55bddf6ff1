"""All configuration, in one place. Every field can be set by an environment
variable named PAIRSTREAM_<FIELD> (e.g. PAIRSTREAM_EXPIRY_SECONDS=120)."""

from __future__ import annotations

from functools import cached_property, lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.kafka.connection import KafkaConnection
from pairing.grammar import Sizes
from pairing.key_state import MICROS, PairingConfig
from pairing.patterns import PatternError, PatternFile, load_patterns

ROOT = Path(__file__).resolve().parent.parent
SIZES = Sizes()  # the defaults: pairing/grammar.py says why


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
    events_format: Literal["json", "debezium"] = Field(
        "json",
        description="what the input topic holds: JSON events (docs/grammar.md), or the change"
        " records of Debezium's PostgreSQL connector for the events table (docs/cdc.md)",
    )
    events_partitions: int = Field(
        8,
        ge=1,
        description="partitions of the input topic when it does not exist yet; an existing"
        " one is taken as it is",
    )
    keyed_topic: str = Field("events-by-timestamp", description="events re-keyed by pairing key")
    pairs_topic: str = "pairs"
    unpaired_topic: str = "unpaired"
    dead_letter_topic: str = "events.dlq"
    # As many as the input has by default: every worker that ingests can pair, spread
    # evenly over 1, 2, 4 or 8 workers. Beyond, move the state (docs/keyed-move.md).
    partitions: int = Field(
        8, ge=1, description="partitions of the keyed topic and of the state changelogs"
    )
    replication_factor: int | None = Field(None, ge=1, description="replicas of every topic"
        " a worker creates; unset: the cluster's default.replication.factor")  # fmt: skip

    # Kafka connection: every client of the project takes it from app/kafka/connection.py
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="how clients connect: TLS (SSL), SASL, both, or neither"
    )
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="SASL mechanism, with SASL_PLAINTEXT or SASL_SSL"
    )
    kafka_username: str | None = Field(None, description="SASL username")
    kafka_password: SecretStr | None = Field(None, description="SASL password; never logged")
    kafka_password_file: Path | None = Field(
        None, description="a file holding the SASL password (a mounted secret); wins over it"
    )
    kafka_ca_file: Path | None = Field(
        None, description="PEM CA certificates to trust; none: the system's trust store"
    )
    kafka_cert_file: Path | None = Field(None, description="PEM client certificate (mutual TLS)")
    kafka_key_file: Path | None = Field(
        None, description="PEM private key of the client certificate, unencrypted"
    )
    kafka_check_hostname: bool = Field(
        True, description="the broker's certificate must name the host connected to"
    )

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
    # Sizes and the clock guard (docs/grammar.md, docs/event-time.md; every input)
    max_event_bytes: int = Field(SIZES.value_bytes, gt=0, description="largest input value")
    max_key_bytes: int = Field(SIZES.key_bytes, gt=0, description="largest input key")
    max_record_bytes: int = Field(SIZES.record_bytes, gt=0, description="largest record written")
    max_ahead_seconds: float = Field(60.0, ge=0, description="the clock guard; 0: none")
    tick_interval_seconds: float = Field(
        10.0, gt=0, description="how often quiet partitions check max wait and idleness"
    )

    # Processing
    commit_interval_seconds: float = Field(
        0.02,
        gt=0,
        description="the latency knob: a worker commits its one transaction as soon as the"
        " one before has ended and this long has passed since it began; longer: fewer,"
        " larger transactions (under a backlog they grow by themselves)",
    )
    local_handoff: bool = Field(
        True, description="pair an event whose keyed partition this worker pairs in ingest's"
        " transaction, not through the keyed topic: one transaction to its pair, not two",
    )  # fmt: skip
    watermark_interval_seconds: float = Field(
        0.5,
        gt=0,
        description="how often each input partition's event-time progress reaches the keyed"
        " partitions (a watermark record to each): unpaired and expired outcomes come up to"
        " this much later than the progress that decides them",
    )
    max_run_records: int = Field(
        500,
        ge=1,
        description="most records of one partition that ingest and pairing process as one"
        " run (one step); a run holds the event loop while it is processed",
    )
    session_timeout_seconds: float = Field(
        10.0, gt=0, description="how soon the group notices a dead worker and rebalances"
    )
    group_instance_id: str | None = Field(
        None,
        description="static group membership: a worker restarted under the same id (unique"
        " per worker, e.g. a pod name) takes its partitions back at once, without waiting out"
        " the session timeout; a worker stopped for good keeps them until that timeout",
    )
    fetch_max_wait_seconds: float = Field(
        0.01,
        gt=0,
        le=1.5,
        description="how long a fetch of quiet partitions waits at the broker; the next fetch"
        " of busy ones and a rebalance's offset look-ups wait behind it (faust: 1.5 s)",
    )
    quiet_fetch_max_wait_seconds: float = Field(
        0.25,
        gt=0,
        le=1.5,
        description="fetch_max_wait_seconds once no record has come for a second: a quiet"
        " worker makes a few fetches a second, not one every fetch_max_wait_seconds. A record"
        " arriving ends the wait at once (and the quiet); a partition resumed while a fetch"
        " waits is fetched up to this much later",
    )
    fetch_min_bytes: int = Field(
        1,
        ge=1,
        description="how much a fetch gathers before the broker answers it (or"
        " fetch_max_wait_seconds passed); 1 answers at the first record",
    )
    metadata_refresh_seconds: float = Field(
        10.0,
        gt=0,
        description="how often a worker refreshes cluster metadata: a subscribed topic it did"
        " not see at its assignment (just created) is picked up within this time",
    )
    topics_ready_timeout_seconds: float = Field(60.0, gt=0, description="how long a starting"
        " worker waits, before it joins the group, for its tables' changelog topics to show in"
        " the broker's metadata with a leader for every partition; an assignment made without"
        " them would start the tables empty")  # fmt: skip
    stuck_seconds: float = Field(120.0, gt=0, description="/live fails for a partition with"
        " committed records to read and none processed for this long (docs/deploy.md)")  # fmt: skip
    producer_linger_seconds: float = Field(
        0.005,
        ge=0,
        description="how long a producer gathers records into one request; a commit waits"
        " for what is still gathered, so a short linger keeps batches travelling while the"
        " transaction is open (faust's 0 sends a request for every record or two)",
    )
    producer_batch_bytes: int = Field(
        256 * 1024,
        ge=16 * 1024,
        le=1_000_000,
        description="most bytes of one partition's records a producer gathers into one batch;"
        " at most the topics' max.message.bytes (the broker's default: 1 MiB). A produce"
        " request carries one batch a partition, so at faust's 16 KiB a worker ran at about"
        " half the rate; a step opens the next batch behind a full one, up to 8 a partition"
        " waiting for the sender",
    )
    transaction_timeout_seconds: float = Field(
        60.0, gt=0, description="the broker aborts a transaction left open this long; a step or"
        " a commit not ended within it crashes the worker (to be restarted)",
    )  # fmt: skip
    stop_grace_seconds: float = Field(
        30.0,
        gt=0,
        description="a worker stopping (on SIGTERM, or after a crash) that has not stopped within"
        " this long exits at once, as kill -9 would: the open transactions abort and nothing"
        " is lost. faust's stop could wait 20 minutes on sends to a bounced broker",
    )
    bench_without_transactions: bool = Field(
        False, description="benchmarks only (python -m bench): the same processing,"
        " at-least-once, to measure what transactions cost; after a crash outputs can repeat",
    )  # fmt: skip
    standby_replicas: int = Field(0, ge=0, description="warm copies of each table partition")
    processing_error_policy: Literal["dead-letter", "stop"] = Field(
        "dead-letter",
        description="a record whose processing raises: dead-lettered with the exception, in its"
        " step's transaction, and the partition goes on; or the worker stops"
        " (docs/exactly-once.md)",
    )
    event_loop: Literal["uvloop", "aio"] = Field(
        "uvloop", description="a worker's event loop: uvloop, or asyncio's own (aio), slower"
        " in its loop and socket transports; faust's `-L` is overridden",
    )  # fmt: skip
    gc_thresholds: tuple[int, int, int] = Field(
        (100_000, 50, 100),
        description="Python's garbage collector thresholds (gc.set_threshold) in a worker,"
        " whose objects from the start are frozen once it is ready (gc.freeze): with"
        " Python's (700, 10, 10) collections took about a sixth of a worker's CPU and"
        " paused it up to 0.4-0.7 s, for the few reference cycles the hot path makes",
    )
    rocksdb_write_buffer_bytes: int = Field(
        4 * 2**20,
        ge=2**16,
        description="RocksDB memtable of each table partition: a restart after a kill -9"
        " replays up to about this much of RocksDB's write-ahead log per partition"
        " (faust's 64 MiB: 0.8 s a partition with 250,000 keys pending)",
    )
    data_dir: Path = Field(ROOT / ".run" / "worker", description="RocksDB state and worker files")
    web_port: int = Field(6066, description="this worker's stats, metrics and dashboard")
    web_host: str = Field("127.0.0.1", description="interface the web server binds to")
    web_canonical_url: str | None = Field(
        None, description="URL other workers reach this one at; default http://web_host:web_port"
    )
    web_token: SecretStr | None = Field(
        None,
        description="when set, data endpoints need `Authorization: Bearer <token>`; never logged",
    )
    web_token_file: Path | None = Field(
        None, description="a file holding the web token (a mounted secret); wins over it"
    )
    web_open_metrics: bool = Field(
        False, description="with a web token: serve /metrics and the dashboard page without it"
    )
    debug: bool = Field(
        False, description="also serve faust's raw table dumps (/table), graph and sensor pages"
    )
    faust_sensor: bool = Field(
        False, description="also run faust-streaming's own sensor, served by /metrics as"
        " `faust_…`: faust calls it for every record, event and send, a cost on the hot path",
    )  # fmt: skip

    # The deposit chain: validation and ledger services (docs/chain.md)
    chain_enabled: bool = Field(False, description="run the deposit chain's agents")
    deposits_topic: str = Field("deposits", description="deposits in (JSON)")
    accounts_topic: str = Field("accounts", description="account changes in (compacted)")
    validated_topic: str = Field("deposits.validated", description="valid deposits, with balance")
    deposits_dead_letter_topic: str = Field(
        "deposits.dlq", description="invalid deposits and account changes, with the reason"
    )

    # Enrichment of pairs from a reference table (docs/chain.md)
    enrichment_enabled: bool = Field(False, description="run the enrichment agents")
    sources_topic: str = Field("sources", description="reference rows by day (compacted)")
    enriched_topic: str = Field("pairs.enriched", description="pairs with their day's row")
    sources_dead_letter_topic: str = Field("sources.dlq", description="invalid reference rows")
    enrichment_bound_seconds: float = Field(
        60.0, gt=0, description="event time a pair waits for a missing row"
    )
    enrichment_max_wait_seconds: float = Field(
        30.0, gt=0, description="wall-clock time a pair waits for a missing row (quiet streams)"
    )

    # Patterns over the stream (docs/patterns.md)
    patterns_file: Path | None = Field(
        None, description="a pattern file (TOML): the worker runs its patterns; none: no patterns"
    )
    match_topic_prefix: str = Field(
        "matches.", description="each pattern's matches go to this prefix + the pattern's name"
    )
    pattern_lateness_seconds: float | None = Field(
        None,
        ge=0,
        description="event time the patterns' watermark lags the sources'; default = expiry",
    )
    pattern_watermark_interval_seconds: float = Field(
        0.05,
        gt=0,
        description="how often each pattern input partition's event-time progress reaches"
        " the partitions of the pattern events: a match comes up to this much later than"
        " the progress that decides it (docs/patterns.md, Figures)",
    )
    pattern_max_partials: int = Field(
        1000, ge=1, description="partial matches one key of a pattern keeps; beyond, the oldest"
        " are dropped (counted as pattern_partials_dropped)",
    )  # fmt: skip

    # The click-through rate of the join examples (docs/patterns.md, analytics/ctr.py)
    ctr_searches_topic: str = Field("searches", description="a pattern input: the searches")
    ctr_clicks_topic: str = Field("clicks", description="a pattern input: the clicks")
    ctr_join_pattern: str = Field(
        "search-click", description="the pattern whose matches are a search and a click"
    )
    ctr_outer_pattern: str = Field(
        "search-without-click", description="the pattern whose matches are unclicked searches"
    )
    ctr_window_seconds: int = Field(3600, gt=0, description="CTR's tumbling window, by search time")

    # Delivery of a topic's records to a third-party HTTP API (docs/delivery.md)
    delivery_enabled: bool = Field(False, description="run the delivery agent")
    delivery_topic: str | None = Field(
        None, description="records to deliver; default the pairs topic"
    )
    delivery_dead_letter_topic: str = Field(
        "deliveries.dlq", description="messages the API rejected (4xx) or that ran out of time"
    )
    delivery_uncertain_topic: str = Field(
        "deliveries.uncertain", description="parked messages the API may or may not have"
    )
    delivery_url: str = Field(
        "http://127.0.0.1:8080/orders", description="each record is POSTed here as the body"
    )
    delivery_status_url: str | None = Field(
        None, description="the API's status lookup by idempotency key, `{key}` in it"
    )
    delivery_headers: dict[str, str] = Field(
        default_factory=dict, description="extra request headers, as JSON"
    )
    delivery_authorization: SecretStr | None = Field(
        None, description="Authorization header value; never logged or shown"
    )
    delivery_idempotency_header: str = Field(
        "Idempotency-Key", description="request header carrying the message's idempotency key"
    )
    delivery_id_field: str = Field(
        "id", description="JSON field holding a message's identity; else a fingerprint"
    )
    delivery_uncertain: Literal["resend", "park"] = Field(
        "park", description="an uncertain message when the API has no lookup: park or resend"
    )
    delivery_timeout_seconds: float = Field(10.0, gt=0, description="per HTTP call")
    delivery_settle_seconds: float = Field(
        60.0, ge=0, description="uncertain: looked up no sooner than this after its last call"
    )
    delivery_deadline_seconds: float = Field(
        600.0,
        gt=0,
        description="a message still failing this long after its first call is dead-lettered",
    )
    delivery_backoff_seconds: float = Field(0.5, gt=0, description="first retry delay")
    delivery_backoff_max_seconds: float = Field(30.0, gt=0, description="longest retry delay")
    delivery_max_in_flight: int = Field(
        32, ge=1, description="HTTP calls in flight per worker; also caps each partition's queue"
    )
    delivery_retention_seconds: float = Field(
        7 * 24 * 3600.0, gt=0, description="how long a final message is remembered (duplicates)"
    )
    delivery_crash_after_calls: int | None = Field(
        None, ge=1, description="testing only: exit as SIGKILL would after this many calls"
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

    # The events table's database (docs/cdc.md): reconciliation of its Delta replica reads it
    postgres_host: str = "127.0.0.1"
    postgres_port: int = Field(5433, description="`python -m tools.postgres`'s default")
    postgres_database: str = "pairstream"
    postgres_user: str = Field("pairstream_app", description="may SELECT the events table")
    postgres_password: SecretStr | None = Field(None, description="never logged")
    postgres_password_file: Path | None = Field(None, description="a mounted secret; wins")

    @model_validator(mode="after")
    def _secrets_from_files(self) -> Settings:
        # A mounted secret is a file; read once here, so nothing else knows where it came from.
        for field, source in (
            ("kafka_password", self.kafka_password_file),
            ("web_token", self.web_token_file),
            ("postgres_password", self.postgres_password_file),
        ):
            if source is not None:
                try:
                    secret = source.read_text().rstrip("\r\n")
                except OSError as exc:
                    raise ValueError(f"{field}_file {source}: {exc.strerror}") from None
                object.__setattr__(self, field, SecretStr(secret))
        return self

    @property
    def pairing(self) -> PairingConfig:
        return PairingConfig(
            expiry_us=int(self.expiry_seconds * MICROS),
            max_wait_s=self.max_wait_seconds or self.expiry_seconds,
            dedup_retention_us=int(self.dedup_retention_seconds * MICROS),
        )

    @cached_property
    def sizes(self) -> Sizes:
        return Sizes(self.max_key_bytes, self.max_event_bytes, self.max_record_bytes)

    @property
    def max_ahead_us(self) -> int | None:
        return int(self.max_ahead_seconds * MICROS) if self.max_ahead_seconds else None

    @cached_property
    def patterns(self) -> PatternFile | None:
        """The pattern file, read and validated (PatternError says what is wrong),
        including that no other stage of the worker reads its inputs: a topic's partition
        is one task, whose offsets one stage commits."""
        if self.patterns_file is None:
            return None
        declared = load_patterns(self.patterns_file)
        assert declared.input is not None  # load_patterns requires it
        read = {
            self.events_topic: "pairing's input (PAIRSTREAM_EVENTS_TOPIC)",
            self.keyed_topic: "pairing's keyed topic",
            **({self.delivery_source: "the delivery's input"} if self.delivery_enabled else {}),
            **(
                {t: "the deposit chain's input" for t in (self.deposits_topic, self.accounts_topic)}
                if self.chain_enabled
                else {}
            ),
            **({self.sources_topic: "the enrichment's input"} if self.enrichment_enabled else {}),
        }
        for topic in declared.input.topics:
            if topic in read:
                raise PatternError(
                    f"{self.patterns_file}: [input] topic {topic!r} is {read[topic]}: patterns"
                    " read topics no other stage of the worker reads (pairing's outputs may be"
                    " among them)"
                )
        return declared

    @property
    def pattern_events_topic(self) -> str:
        """Pattern inputs re-keyed by each pattern key (internal)."""
        return f"{self.app_id}-pattern-events"

    def match_topic(self, pattern: str) -> str:
        return self.match_topic_prefix + pattern

    def pattern_topics(self) -> tuple[list[str], list[str]]:
        """The pattern file's input topics, and its match topics (none without a file)."""
        if self.patterns is None or self.patterns.input is None:
            return [], []
        matches = [self.match_topic(pattern.name) for pattern in self.patterns.patterns]
        return list(self.patterns.input.topics), matches

    @property
    def pattern_lateness_us(self) -> int:
        lateness = self.pattern_lateness_seconds
        return int((self.expiry_seconds if lateness is None else lateness) * MICROS)

    @property
    def delivery_source(self) -> str:
        return self.delivery_topic or self.pairs_topic

    @property
    def deposits_by_account_topic(self) -> str:
        """Deposits re-keyed by account (internal)."""
        return f"{self.app_id}-deposits-by-account"

    @property
    def accounts_by_account_topic(self) -> str:
        """Account changes re-keyed by account (internal)."""
        return f"{self.app_id}-accounts-by-account"

    @property
    def sources_by_partition_topic(self) -> str:
        """Reference rows, each sent to every partition (internal)."""
        return f"{self.app_id}-sources-by-partition"

    @property
    def delivery_by_id_topic(self) -> str:
        """The delivery input re-keyed by message identity (internal)."""
        return f"{self.app_id}-deliveries-by-id"

    @property
    def delivery_log_topic(self) -> str:
        """Attempts and outcomes of calls, applied to the store (internal)."""
        return f"{self.app_id}-deliveries-log"

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.removeprefix("kafka://").replace(";", ",")

    @cached_property
    def kafka(self) -> KafkaConnection:
        """How every Kafka client connects (app/kafka/connection.py); one TLS context."""
        return KafkaConnection.from_settings(self)


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings()
