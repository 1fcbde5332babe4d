// The inbox protocol of docs/inbox.md in Java (kafka-clients + JDBC): reads outboxd's
// account events and keeps balances and a ledger in its own PostgreSQL database, each event
// applied once and in order per account, through crashes and rebalances. The same program
// as crates/inbox/src/bin/inbox-example.rs, to copy.
//
//   INBOX_DATABASE_URL='jdbc:postgresql://db/ledger?user=ledger' INBOX_BOOTSTRAP_SERVERS=kafka:9092 \
//   INBOX_TOPICS=outbox.account java -cp 'target/inbox-example.jar:target/lib/*' outboxd.example.InboxExample
//
// | variable | meaning |
// |---|---|
// | INBOX_DATABASE_URL | the consumer's database, a JDBC URL; sql/inbox.sql installed in it |
// | INBOX_BOOTSTRAP_SERVERS | Kafka |
// | INBOX_TOPICS | comma-separated topics |
// | INBOX_GROUP | consumer group and inbox name, default balances |
// | INBOX_KAFKA_CONFIG | extra consumer settings, name=value,...; auto.commit.interval.ms (default 5000) paces this program's commits |
// | INBOX_KEEP_KEYS_HOURS | dedup key retention, default 336 (14 days); 0: keep all |
// | INBOX_INSTANCE | this process's name in the ledger, default pid-<pid> |
//
// Each event's payload is {"amount": <integer>}, its record key the account. It prints one
// line per event; it exits 1 on an error (a supervisor restarts it, and the group's
// committed offsets re-deliver what was not committed, which the inbox skips), 2 on a bad
// setting, 0 after SIGTERM (leaving the group, its offsets committed).
package outboxd.example;

import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Types;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class InboxExample {
    static final String TABLES = """
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
        )""";
    static final int MAX_HELD = 10_000;

    static final class Setting extends Exception {
        Setting(String message) {
            super(message);
        }
    }

    /** What the inbox needs of a record (docs/inbox.md, "What a record carries"). */
    record Event(String key, String eventId, String aggregateType, String aggregateId,
                 Long version, String topic, int partition, long offset, byte[] payload) {
        static Event of(ConsumerRecord<byte[], byte[]> r) {
            Map<String, String> headers = new HashMap<>();
            // The last header of a name wins: outboxd's own come after the row's.
            for (Header h : r.headers()) {
                headers.put(h.key(), h.value() == null ? null : new String(h.value(), StandardCharsets.UTF_8));
            }
            String id = headers.get("id");
            if (id == null) {
                throw new IllegalStateException(r.topic() + "/" + r.partition() + "@" + r.offset()
                    + " has no id header: INBOX_TOPICS must name only topics outboxd writes");
            }
            String key = headers.get("idempotency_key");
            Long version = null;
            if (headers.get("version") != null) {
                try {
                    version = Long.parseLong(headers.get("version"));
                } catch (NumberFormatException e) {
                    throw new IllegalStateException("header version is \"" + headers.get("version")
                        + "\", not a whole number");
                }
            }
            return new Event(key == null || key.isEmpty() ? id : key, id,
                Objects.requireNonNullElse(headers.get("aggregate_type"), ""),
                r.key() == null ? null : new String(r.key(), StandardCharsets.UTF_8),
                version, r.topic(), r.partition(), r.offset(), r.value());
        }

        String where() {
            return topic + "/" + partition + "@" + offset + " " + (aggregateId == null ? "-" : aggregateId)
                + " v" + (version == null ? "-" : version) + " key=" + key;
        }
    }

    enum Kind { APPLIED, DUPLICATE, STALE, GAP }

    record Outcome(Kind kind, long known, long balance) {}

    static String describe(Event e, Outcome o) {
        return switch (o.kind()) {
            case APPLIED -> "applied " + e.where() + ": balance " + o.balance();
            case DUPLICATE -> "duplicate " + e.where() + ": applied before, skipped";
            case STALE -> "stale " + e.where() + ": version " + e.version() + " at or below " + o.known()
                + ", skipped";
            case GAP -> "held " + e.where() + ": version " + e.version() + " after " + o.known()
                + "; waiting for the missing version, the partition's commit stays here";
        };
    }

    /** This consumer's place in one partition it owns. */
    static final class Position {
        long next; // the offset after the last record handled
        final TreeMap<Long, Event> held = new TreeMap<>(); // behind a version gap, by offset

        Position(long next) {
            this.next = next;
        }

        /** What the group may commit: the first held record, else the next to read. */
        long committable() {
            return held.isEmpty() ? next : held.firstKey();
        }
    }

    final Connection db;
    final String group;
    final String instance;
    final Map<TopicPartition, Position> positions = new HashMap<>();

    InboxExample(Connection db, String group, String instance) {
        this.db = db;
        this.group = group;
        this.instance = instance;
    }

    /** Steps 1-4: the key first, the version check, the change, one commit. */
    Outcome process(Event e) throws SQLException {
        try {
            Outcome o = apply(e);
            if (o.kind() == Kind.DUPLICATE || o.kind() == Kind.GAP) {
                db.rollback();
            } else {
                db.commit(); // a stale event's key stays too: its replay is a plain duplicate
            }
            return o;
        } catch (SQLException | RuntimeException err) {
            db.rollback(); // nothing recorded: a retry applies the event
            throw err;
        }
    }

    private Outcome apply(Event e) throws SQLException {
        try (PreparedStatement s = db.prepareStatement(
                "INSERT INTO inbox_processed (consumer, key, event_id, topic, kafka_partition, kafka_offset)"
                    + " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING")) {
            s.setString(1, group);
            s.setString(2, e.key());
            s.setString(3, e.eventId());
            s.setString(4, e.topic());
            s.setInt(5, e.partition());
            s.setLong(6, e.offset());
            if (s.executeUpdate() == 0) {
                return new Outcome(Kind.DUPLICATE, 0, 0);
            }
        }
        boolean versioned = e.aggregateId() != null && e.version() != null;
        if (versioned) {
            // A row to lock even for the aggregate's first event: racing consumers queue here.
            try (PreparedStatement s = db.prepareStatement(
                    "INSERT INTO inbox_versions (consumer, aggregate_type, aggregate_id, version)"
                        + " VALUES (?, ?, ?, NULL) ON CONFLICT DO NOTHING")) {
                aggregate(s, e, 1);
                s.executeUpdate();
            }
            try (PreparedStatement s = db.prepareStatement(
                    "SELECT version FROM inbox_versions WHERE consumer = ? AND aggregate_type = ?"
                        + " AND aggregate_id = ? FOR UPDATE")) {
                aggregate(s, e, 1);
                try (ResultSet rs = s.executeQuery()) {
                    rs.next();
                    long known = rs.getLong(1);
                    if (!rs.wasNull() && e.version() <= known) {
                        return new Outcome(Kind.STALE, known, 0);
                    }
                    if (!rs.wasNull() && e.version() > known + 1) {
                        return new Outcome(Kind.GAP, known, 0);
                    }
                }
            }
        }
        if (e.aggregateId() == null) {
            throw new IllegalStateException(e.where() + ": the record has no key (the account)");
        }
        long amount = amount(e);
        try (PreparedStatement s = db.prepareStatement(
                "INSERT INTO ledger (account, version, event_key, amount, applied_by) VALUES (?, ?, ?, ?, ?)")) {
            s.setString(1, e.aggregateId());
            if (e.version() == null) {
                s.setNull(2, Types.BIGINT);
            } else {
                s.setLong(2, e.version());
            }
            s.setString(3, e.key());
            s.setLong(4, amount);
            s.setString(5, instance);
            s.executeUpdate();
        }
        long balance;
        try (PreparedStatement s = db.prepareStatement(
                "INSERT INTO balances (account, balance) VALUES (?, ?) ON CONFLICT (account)"
                    + " DO UPDATE SET balance = balances.balance + EXCLUDED.balance RETURNING balance")) {
            s.setString(1, e.aggregateId());
            s.setLong(2, amount);
            try (ResultSet rs = s.executeQuery()) {
                rs.next();
                balance = rs.getLong(1);
            }
        }
        if (versioned) {
            try (PreparedStatement s = db.prepareStatement(
                    "UPDATE inbox_versions SET version = ?, updated_at = now()"
                        + " WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ?")) {
                s.setLong(1, e.version());
                aggregate(s, e, 2);
                s.executeUpdate();
            }
        }
        return new Outcome(Kind.APPLIED, 0, balance);
    }

    private void aggregate(PreparedStatement s, Event e, int from) throws SQLException {
        s.setString(from, group);
        s.setString(from + 1, e.aggregateType());
        s.setString(from + 2, e.aggregateId());
    }

    /** The payload's integer "amount"; PostgreSQL reads the JSON, so no JSON library is needed. */
    private long amount(Event e) throws SQLException {
        String text = null;
        if (e.payload() != null) {
            try (PreparedStatement s = db.prepareStatement(
                    "SELECT CASE WHEN jsonb_typeof(?::jsonb) = 'object' THEN ?::jsonb ->> 'amount' END")) {
                String json = new String(e.payload(), StandardCharsets.UTF_8);
                s.setString(1, json);
                s.setString(2, json);
                try (ResultSet rs = s.executeQuery()) {
                    rs.next();
                    text = rs.getString(1);
                }
            }
        }
        try {
            return Long.parseLong(Objects.requireNonNull(text));
        } catch (NumberFormatException | NullPointerException err) {
            throw new IllegalStateException(e.where() + ": the payload has no integer \"amount\"");
        }
    }

    void handle(ConsumerRecord<byte[], byte[]> r) throws SQLException {
        Event e = Event.of(r);
        TopicPartition tp = new TopicPartition(e.topic(), e.partition());
        Position p = positions.computeIfAbsent(tp, k -> new Position(e.offset()));
        if (e.offset() < p.next) {
            p.held.clear(); // read again from earlier: the held records come again
        }
        p.next = e.offset() + 1;
        Outcome o = process(e);
        System.out.println(describe(e, o));
        if (o.kind() == Kind.GAP) {
            p.held.put(e.offset(), e);
            if (p.held.size() > MAX_HELD) {
                throw new IllegalStateException(p.held.size() + " records held in " + tp
                    + " behind a version gap (first: " + p.held.firstEntry().getValue().where()
                    + "): repair the missing version (re-send it from the dead-letter topic) or move"
                    + " inbox_versions on, then restart");
            }
            return;
        }
        if (e.version() == null) {
            return;
        }
        // Release the held records of this aggregate, in offset order, until one is a gap.
        for (Long offset : new ArrayList<>(p.held.keySet())) {
            Event h = p.held.get(offset);
            if (!h.aggregateType().equals(e.aggregateType()) || !Objects.equals(h.aggregateId(), e.aggregateId())) {
                continue;
            }
            Outcome released = process(h);
            System.out.println(describe(h, released));
            if (released.kind() == Kind.GAP) {
                break;
            }
            p.held.remove(offset);
        }
    }

    /** The committable offsets of the given owned partitions. */
    Map<TopicPartition, OffsetAndMetadata> committable(Collection<TopicPartition> of) {
        Map<TopicPartition, OffsetAndMetadata> out = new HashMap<>();
        for (TopicPartition tp : of) {
            Position p = positions.get(tp);
            if (p != null) {
                out.put(tp, new OffsetAndMetadata(p.committable()));
            }
        }
        return out;
    }

    static Map<String, String> settings() throws Setting {
        Map<String, String> s = new HashMap<>();
        for (String name : List.of("INBOX_DATABASE_URL", "INBOX_BOOTSTRAP_SERVERS", "INBOX_TOPICS")) {
            String v = System.getenv(name);
            if (v == null || v.isBlank()) {
                throw new Setting(name + " is not set: see the table at the top of InboxExample.java");
            }
            s.put(name, v.trim());
        }
        s.put("INBOX_GROUP", Objects.requireNonNullElse(System.getenv("INBOX_GROUP"), "balances"));
        s.put("INBOX_INSTANCE", Objects.requireNonNullElse(System.getenv("INBOX_INSTANCE"),
            "pid-" + ProcessHandle.current().pid()));
        s.put("INBOX_KAFKA_CONFIG", Objects.requireNonNullElse(System.getenv("INBOX_KAFKA_CONFIG"), ""));
        String hours = Objects.requireNonNullElse(System.getenv("INBOX_KEEP_KEYS_HOURS"), "336").trim();
        if (!hours.matches("[0-9]{1,6}")) {
            throw new Setting("INBOX_KEEP_KEYS_HOURS is \"" + hours
                + "\": write a whole number of hours (0: keep all)");
        }
        s.put("INBOX_KEEP_KEYS_HOURS", hours);
        return s;
    }

    static Properties kafkaConfig(Map<String, String> s) throws Setting {
        Properties p = new Properties();
        p.put("bootstrap.servers", s.get("INBOX_BOOTSTRAP_SERVERS"));
        p.put("group.id", s.get("INBOX_GROUP"));
        // The example commits, never past a held record.
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        // Never an aborted transactional producer's records.
        p.put("isolation.level", "read_committed");
        p.put("auto.commit.interval.ms", "5000");
        for (String pair : s.get("INBOX_KAFKA_CONFIG").split(",")) {
            if (pair.isBlank()) {
                continue;
            }
            int eq = pair.indexOf('=');
            if (eq < 0) {
                throw new Setting("INBOX_KAFKA_CONFIG has \"" + pair
                    + "\": write name=value pairs separated by commas");
            }
            p.put(pair.substring(0, eq).trim(), pair.substring(eq + 1).trim());
        }
        if (!"false".equals(p.get("enable.auto.commit"))) {
            throw new Setting("INBOX_KAFKA_CONFIG sets enable.auto.commit: remove it (auto-commit"
                + " commits past records held behind a gap)");
        }
        return p;
    }

    static void run(Map<String, String> s) throws Exception {
        Connection db = DriverManager.getConnection(s.get("INBOX_DATABASE_URL"));
        db.setAutoCommit(false);
        try (Statement st = db.createStatement()) {
            // Consumers starting together must not race on CREATE TABLE.
            st.execute("SELECT pg_advisory_xact_lock(hashtext('inbox-example.tables'))");
            st.execute(TABLES);
        }
        db.commit();
        Properties config = kafkaConfig(s);
        long commitEveryMs = Long.parseLong(config.getProperty("auto.commit.interval.ms"));
        InboxExample inbox = new InboxExample(db, s.get("INBOX_GROUP"), s.get("INBOX_INSTANCE"));
        List<String> topics = new ArrayList<>();
        for (String t : s.get("INBOX_TOPICS").split(",")) {
            if (!t.isBlank()) {
                topics.add(t.trim());
            }
        }
        long keepHours = Long.parseLong(s.get("INBOX_KEEP_KEYS_HOURS"));
        try (KafkaConsumer<byte[], byte[]> consumer =
                 new KafkaConsumer<>(config, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(topics, new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> revoked) {
                    // Called inside poll(), between records: what was done is committed
                    // for the next owner, then forgotten.
                    consumer.commitSync(inbox.committable(revoked));
                    revoked.forEach(inbox.positions::remove);
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> lost) {
                    // Another member may own them already: commit nothing.
                    lost.forEach(inbox.positions::remove);
                }

                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> assigned) {
                    // Read from the committed offset: held records come again.
                    assigned.forEach(inbox.positions::remove);
                }
            });
            // SIGTERM stops the loop at the next poll; the JVM then exits 0, not 143.
            AtomicBoolean stop = new AtomicBoolean();
            sun.misc.Signal.handle(new sun.misc.Signal("TERM"), sig -> {
                stop.set(true);
                consumer.wakeup();
            });
            System.out.println("inbox-example: consuming " + topics + " as group " + s.get("INBOX_GROUP"));
            long lastCommit = System.nanoTime();
            long nextPrune = System.nanoTime();
            try {
                while (!stop.get()) {
                    for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                        inbox.handle(r);
                    }
                    if (System.nanoTime() - lastCommit >= commitEveryMs * 1_000_000L) {
                        // Async: a lost commit is only a re-delivery, which the inbox skips.
                        consumer.commitAsync(inbox.committable(consumer.assignment()), (offsets, err) -> {
                            if (err != null) {
                                System.err.println("inbox-example: commit failed, retried next time: " + err);
                            }
                        });
                        lastCommit = System.nanoTime();
                    }
                    if (keepHours > 0 && System.nanoTime() >= nextPrune) {
                        nextPrune = System.nanoTime() + Duration.ofMinutes(5).toNanos();
                        try (PreparedStatement ps = db.prepareStatement(
                                "SELECT public.inbox_prune(?, make_interval(hours => ?))")) {
                            ps.setString(1, inbox.group);
                            ps.setInt(2, Math.toIntExact(keepHours));
                            try (ResultSet rs = ps.executeQuery()) {
                                rs.next();
                                if (rs.getLong(1) > 0) {
                                    System.out.println("pruned " + rs.getLong(1) + " keys older than " + keepHours + " h");
                                }
                            }
                        }
                        db.commit();
                    }
                }
            } catch (WakeupException e) {
                if (!stop.get()) {
                    throw e;
                }
            }
            // Leaving: commit what was done; close() then leaves the group.
            consumer.commitSync(inbox.committable(consumer.assignment()));
            inbox.positions.clear();
        }
        db.close();
    }

    public static void main(String[] args) {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        Map<String, String> s;
        try {
            s = settings();
            kafkaConfig(s);
        } catch (Setting e) {
            System.err.println("inbox-example: " + e.getMessage());
            System.exit(2);
            return;
        }
        try {
            run(s);
        } catch (Exception e) {
            System.err.println("inbox-example: " + e);
            System.exit(1);
        }
        System.out.println("inbox-example: stopped");
        System.exit(0);
    }
}
