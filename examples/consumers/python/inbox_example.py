"""The inbox protocol of docs/inbox.md in Python (confluent-kafka + psycopg 3): reads
outboxd's account events and keeps balances and a ledger in its own PostgreSQL database,
each event applied once and in order per account, through crashes and rebalances. The
same program as crates/inbox/src/bin/inbox-example.rs, to copy.

    INBOX_DATABASE_URL=postgresql://ledger@db/ledger INBOX_BOOTSTRAP_SERVERS=kafka:9092 \
    INBOX_TOPICS=outbox.account python inbox_example.py

| variable | meaning |
|---|---|
| INBOX_DATABASE_URL | the consumer's database (libpq key=value or URL); sql/inbox.sql installed in it |
| INBOX_BOOTSTRAP_SERVERS | Kafka |
| INBOX_TOPICS | comma-separated topics |
| INBOX_GROUP | consumer group and inbox name, default balances |
| INBOX_KAFKA_CONFIG | extra librdkafka settings, name=value,name=value |
| INBOX_KEEP_KEYS_HOURS | dedup key retention, default 336 (14 days); 0: keep all |
| INBOX_INSTANCE | this process's name in the ledger, default pid-<pid> |

Each event's payload is {"amount": <integer>}, its record key the account. It prints one
line per event; it exits 1 on an error (a supervisor restarts it, and the group's
committed offsets re-deliver what was not committed, which the inbox skips), 2 on a bad
setting, 0 after SIGTERM (leaving the group, its offsets committed).
"""

import json
import os
import signal
import sys
import time

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

TABLES = """
CREATE TABLE IF NOT EXISTS balances (
    account text   PRIMARY KEY,
    balance bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    seq       bigserial PRIMARY KEY,
    account   text      NOT NULL,
    version   bigint    NULL,
    event_key text      NOT NULL,
    amount    bigint    NOT NULL,
    applied_by text     NOT NULL  -- INBOX_INSTANCE: which process applied it
)"""

MAX_HELD = 10_000
PRUNE_EVERY_S = 300


class Setting(Exception):
    pass


class Event:
    """What the inbox needs of a record (docs/inbox.md, "What a record carries")."""

    def __init__(self, msg):
        headers = {}
        # The last header of a name wins: outboxd's own come after the row's.
        for name, value in msg.headers() or []:
            headers[name] = None if value is None else value.decode("utf-8")
        self.event_id = headers.get("id")
        if self.event_id is None:
            raise ValueError(
                f"{msg.topic()}/{msg.partition()}@{msg.offset()} has no id header: "
                "INBOX_TOPICS must name only topics outboxd writes"
            )
        self.key = headers.get("idempotency_key") or self.event_id
        version = headers.get("version")
        try:
            self.version = None if version is None else int(version)
        except ValueError:
            raise ValueError(f"header version is {version!r}, not a whole number") from None
        self.aggregate_type = headers.get("aggregate_type")
        raw_key = msg.key()
        self.aggregate_id = None if raw_key is None else raw_key.decode("utf-8")
        self.topic, self.partition, self.offset = msg.topic(), msg.partition(), msg.offset()
        self.payload = msg.value()

    def where(self):
        version = "-" if self.version is None else self.version
        return (f"{self.topic}/{self.partition}@{self.offset} {self.aggregate_id or '-'} "
                f"v{version} key={self.key}")


def process(db, group, instance, e):
    """Steps 1-4: the key first, the version check, the change, one commit.
    Returns ("applied", balance), ("duplicate",), ("stale", known) or ("gap", known)."""
    try:
        outcome = _process(db, group, instance, e)
    except BaseException:
        db.rollback()  # nothing recorded: a retry applies the event
        raise
    if outcome[0] in ("duplicate", "gap"):
        db.rollback()
    else:
        db.commit()  # a stale event's key stays too: its replay is a plain duplicate
    return outcome


def _process(db, group, instance, e):
    cur = db.execute(
        "INSERT INTO inbox_processed (consumer, key, event_id, topic, kafka_partition,"
        " kafka_offset) VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
        (group, e.key, e.event_id, e.topic, e.partition, e.offset))
    if cur.rowcount == 0:
        return ("duplicate",)
    versioned = e.aggregate_id is not None and e.version is not None
    aggregate = (group, e.aggregate_type or "", e.aggregate_id)
    if versioned:
        # A row to lock even for the aggregate's first event: racing consumers queue here.
        db.execute(
            "INSERT INTO inbox_versions (consumer, aggregate_type, aggregate_id, version)"
            " VALUES (%s, %s, %s, NULL) ON CONFLICT DO NOTHING", aggregate)
        (known,) = db.execute(
            "SELECT version FROM inbox_versions WHERE consumer = %s AND aggregate_type = %s"
            " AND aggregate_id = %s FOR UPDATE", aggregate).fetchone()
        if known is not None and e.version <= known:
            return ("stale", known)
        if known is not None and e.version > known + 1:
            return ("gap", known)
    amount = json.loads(e.payload or b"null")
    amount = amount.get("amount") if isinstance(amount, dict) else None
    if not isinstance(amount, int) or isinstance(amount, bool):
        raise ValueError(f"{e.where()}: the payload has no integer \"amount\"")
    if e.aggregate_id is None:
        raise ValueError(f"{e.where()}: the record has no key (the account)")
    db.execute(
        "INSERT INTO ledger (account, version, event_key, amount, applied_by)"
        " VALUES (%s, %s, %s, %s, %s)", (e.aggregate_id, e.version, e.key, amount, instance))
    (balance,) = db.execute(
        "INSERT INTO balances (account, balance) VALUES (%s, %s) ON CONFLICT (account)"
        " DO UPDATE SET balance = balances.balance + EXCLUDED.balance RETURNING balance",
        (e.aggregate_id, amount)).fetchone()
    if versioned:
        db.execute(
            "UPDATE inbox_versions SET version = %s, updated_at = now() WHERE consumer = %s"
            " AND aggregate_type = %s AND aggregate_id = %s", (e.version, *aggregate))
    return ("applied", balance)


def describe(e, outcome):
    if outcome[0] == "applied":
        return f"applied {e.where()}: balance {outcome[1]}"
    if outcome[0] == "duplicate":
        return f"duplicate {e.where()}: applied before, skipped"
    if outcome[0] == "stale":
        return f"stale {e.where()}: version {e.version} at or below {outcome[1]}, skipped"
    return (f"held {e.where()}: version {e.version} after {outcome[1]}; waiting for the "
            "missing version, the partition's commit stays here")


class Partition:
    def __init__(self, offset):
        self.next = offset  # the offset after the last record handled
        self.held = {}  # offset -> Event, behind a version gap

    def committable(self):
        return min(self.held) if self.held else self.next


def handle(db, consumer, group, instance, positions, msg):
    e = Event(msg)
    slot = (e.topic, e.partition)
    part = positions.setdefault(slot, Partition(e.offset))
    if e.offset < part.next:
        part.held.clear()  # read again from earlier: the held records come again
    part.next = e.offset + 1
    outcome = process(db, group, instance, e)
    print(describe(e, outcome), flush=True)
    if outcome[0] == "gap":
        part.held[e.offset] = e
        if len(part.held) > MAX_HELD:
            first = part.held[min(part.held)]
            raise RuntimeError(
                f"{len(part.held)} records held in {e.topic}/{e.partition} behind a version "
                f"gap (first: {first.where()}): repair the missing version (re-send it from "
                "the dead-letter topic) or move inbox_versions on, then restart")
    elif e.version is not None:
        # Release the held records of this aggregate, in offset order, until one is a gap.
        for offset in sorted(part.held):
            h = part.held[offset]
            if (h.aggregate_id, h.aggregate_type) != (e.aggregate_id, e.aggregate_type):
                continue
            released = process(db, group, instance, h)
            print(describe(h, released), flush=True)
            if released[0] == "gap":
                break
            del part.held[offset]
    try:
        consumer.store_offsets(offsets=[TopicPartition(e.topic, e.partition, part.committable())])
    except KafkaException as err:
        code = err.args[0].code()
        if code in (KafkaError._STATE, KafkaError._UNKNOWN_PARTITION):
            # Revoked while in hand: the next owner reads from the committed offset.
            positions.pop(slot, None)
        elif code == KafkaError.INVALID_ARG:
            raise RuntimeError("store_offsets refused: set enable.auto.offset.store=false "
                               "(remove it from INBOX_KAFKA_CONFIG)") from err
        else:
            raise


def settings():
    def required(name):
        value = os.environ.get(name, "").strip()
        if not value:
            raise Setting(f"{name} is not set: see the table at the top of inbox_example.py")
        return value

    kafka = {}
    for pair in filter(str.strip, os.environ.get("INBOX_KAFKA_CONFIG", "").split(",")):
        if "=" not in pair:
            raise Setting(f"INBOX_KAFKA_CONFIG has {pair!r}: write name=value pairs separated "
                          "by commas")
        k, v = pair.split("=", 1)
        kafka[k.strip()] = v.strip()
    hours = os.environ.get("INBOX_KEEP_KEYS_HOURS", "336").strip()
    if not hours.isdigit():
        raise Setting(f"INBOX_KEEP_KEYS_HOURS is {hours!r}: write a whole number of hours "
                      "(0: keep all)")
    return {
        "database": required("INBOX_DATABASE_URL"),
        "bootstrap": required("INBOX_BOOTSTRAP_SERVERS"),
        "topics": [t.strip() for t in required("INBOX_TOPICS").split(",") if t.strip()],
        "group": os.environ.get("INBOX_GROUP", "balances"),
        "kafka": kafka,
        "keep_hours": int(hours),
        "instance": os.environ.get("INBOX_INSTANCE", f"pid-{os.getpid()}"),
    }


def run(s):
    db = psycopg.connect(s["database"])
    # Consumers starting together must not race on CREATE TABLE.
    db.execute("SELECT pg_advisory_xact_lock(hashtext('inbox-example.tables'))")
    db.execute(TABLES)
    db.commit()
    config = {
        "bootstrap.servers": s["bootstrap"],
        "group.id": s["group"],
        # The example stores offsets, never past a held record; librdkafka commits the
        # stored ones every auto.commit.interval.ms and when partitions are revoked.
        "enable.auto.offset.store": False,
        "enable.auto.commit": True,
        "auto.offset.reset": "earliest",
        # Never an aborted transactional producer's records.
        "isolation.level": "read_committed",
    }
    config.update(s["kafka"])
    consumer = Consumer(config)
    positions = {}

    def on_revoke(_consumer, partitions):
        for p in partitions:  # the next owner starts from the committed offset
            positions.pop((p.topic, p.partition), None)

    def on_assign(_consumer, partitions):
        for p in partitions:  # read from the committed offset: held records come again
            positions.pop((p.topic, p.partition), None)

    consumer.subscribe(s["topics"], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    print(f"inbox-example: consuming {s['topics']} as group {s['group']}", flush=True)
    next_prune = time.monotonic()
    while not stop:
        msg = consumer.poll(0.5)
        if msg is not None:
            if msg.error():
                if msg.error().fatal() or not msg.error().retriable():
                    raise KafkaException(msg.error())
                print(f"inbox-example: {msg.error()}", file=sys.stderr, flush=True)
            else:
                handle(db, consumer, s["group"], s["instance"], positions, msg)
        if s["keep_hours"] and time.monotonic() >= next_prune:
            next_prune = time.monotonic() + PRUNE_EVERY_S
            (deleted,) = db.execute("SELECT public.inbox_prune(%s, make_interval(hours => %s))",
                                    (s["group"], s["keep_hours"])).fetchone()
            db.commit()
            if deleted:
                print(f"pruned {deleted} keys older than {s['keep_hours']} h", flush=True)
    # Leaves the group and commits the stored offsets.
    consumer.close()
    print("inbox-example: stopped", flush=True)


def main():
    try:
        s = settings()
    except Setting as e:
        print(f"inbox-example: {e}", file=sys.stderr)
        return 2
    try:
        run(s)
    except Exception as e:  # noqa: BLE001 - the supervisor restarts on exit 1
        print(f"inbox-example: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
