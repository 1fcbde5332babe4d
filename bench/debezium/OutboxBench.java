// Debezium side of the outboxd benchmark (see docs/benchmarks.md).
//
// An embedded Debezium engine (PostgreSQL connector, pgoutput, an existing slot, no
// snapshot) with the Outbox Event Router SMT routed by aggregate_type and keyed by
// aggregate_id, and an idempotent KafkaProducer (acks=all). Like Debezium Server's Kafka
// sink, a batch is marked processed (so its offsets, and then the slot, may advance)
// only after every send of the batch was acknowledged by the broker.
//
// Usage: java -cp <jars>:. OutboxBench <key=value>...
//   host port db slot publication bootstrap expected offsets_file
//   [poll_interval_ms max_batch_size linger_ms compression]
// Prints "FIRST <unix ms>" at the first record and "ACKED <n> <unix ms>" when the
// expected number of records is acknowledged; then keeps running until killed.

import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;
import io.debezium.embedded.Connect;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.source.SourceRecord;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;

public final class OutboxBench {
    public static void main(String[] args) throws Exception {
        Map<String, String> a = new HashMap<>();
        for (String arg : args) {
            int eq = arg.indexOf('=');
            if (eq > 0) {
                a.put(arg.substring(0, eq), arg.substring(eq + 1));
            }
        }
        long expected = Long.parseLong(a.getOrDefault("expected", "0"));

        Properties p = new Properties();
        p.setProperty("bootstrap.servers", a.get("bootstrap"));
        p.setProperty("acks", "all");
        p.setProperty("enable.idempotence", "true");
        p.setProperty("max.in.flight.requests.per.connection", "5");
        p.setProperty("linger.ms", a.getOrDefault("linger_ms", "5"));
        p.setProperty("compression.type", a.getOrDefault("compression", "lz4"));
        p.setProperty("key.serializer", ByteArraySerializer.class.getName());
        p.setProperty("value.serializer", ByteArraySerializer.class.getName());
        KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(p);

        AtomicLong acked = new AtomicLong();
        long[] first = {0};
        boolean[] reported = {false};

        boolean debug = System.getenv("BENCH_DBZ_DEBUG") != null;
        long[] lastEnd = {System.currentTimeMillis()};
        DebeziumEngine.ChangeConsumer<RecordChangeEvent<SourceRecord>> sink = (records, committer) -> {
            long batchStart = System.currentTimeMillis();
            if (first[0] == 0 && !records.isEmpty()) {
                first[0] = System.currentTimeMillis();
                System.out.println("FIRST " + first[0]);
                System.out.flush();
            }
            List<Future<RecordMetadata>> sends = new ArrayList<>(records.size());
            for (RecordChangeEvent<SourceRecord> ev : records) {
                SourceRecord r = ev.record();
                if (r.value() == null) {
                    continue; // tombstones: none are expected from an insert-only outbox
                }
                RecordHeaders headers = new RecordHeaders();
                for (Header h : r.headers()) {
                    headers.add(h.key(), bytes(h.value()));
                }
                sends.add(producer.send(new ProducerRecord<>(r.topic(), null, r.timestamp(),
                        bytes(r.key()), bytes(r.value()), headers)));
            }
            // Debezium Server's Kafka sink: wait for every ack of the batch, then commit.
            for (Future<RecordMetadata> f : sends) {
                try {
                    f.get();
                } catch (Exception e) {
                    throw new InterruptedException("send failed: " + e);
                }
            }
            for (RecordChangeEvent<SourceRecord> ev : records) {
                committer.markProcessed(ev);
            }
            committer.markBatchFinished();
            long n = acked.addAndGet(sends.size());
            if (debug) {
                long now = System.currentTimeMillis();
                System.err.println("BATCH " + records.size() + " waited " + (batchStart - lastEnd[0])
                        + " ms, send+ack+commit " + (now - batchStart) + " ms");
                lastEnd[0] = now;
            }
            if (!reported[0] && expected > 0 && n >= expected) {
                reported[0] = true;
                System.out.println("ACKED " + n + " " + System.currentTimeMillis());
                System.out.flush();
            }
        };

        Properties e = new Properties();
        e.setProperty("name", "outboxd-bench");
        e.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        e.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        e.setProperty("offset.storage.file.filename", a.get("offsets_file"));
        e.setProperty("offset.flush.interval.ms", "0");
        e.setProperty("database.hostname", a.getOrDefault("host", "127.0.0.1"));
        e.setProperty("database.port", a.get("port"));
        e.setProperty("database.user", a.getOrDefault("user", "postgres"));
        e.setProperty("database.password", "");
        e.setProperty("database.dbname", a.get("db"));
        e.setProperty("topic.prefix", "bench");
        e.setProperty("plugin.name", "pgoutput");
        e.setProperty("slot.name", a.get("slot"));
        e.setProperty("slot.drop.on.stop", "false");
        e.setProperty("publication.name", a.get("publication"));
        e.setProperty("publication.autocreate.mode", "disabled");
        e.setProperty("snapshot.mode", "no_data");
        e.setProperty("table.include.list", a.getOrDefault("table", "public.outbox"));
        e.setProperty("transforms", "outbox");
        e.setProperty("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
        e.setProperty("transforms.outbox.route.by.field", "aggregate_type");
        e.setProperty("transforms.outbox.table.field.event.key", "aggregate_id");
        e.setProperty("transforms.outbox.table.field.event.id", "id");
        e.setProperty("transforms.outbox.table.field.event.payload", "payload");
        e.setProperty("transforms.outbox.table.fields.additional.placement", "event_type:header:event_type");
        e.setProperty("transforms.outbox.route.topic.replacement", "outbox.${routedByValue}");
        if (a.containsKey("poll_interval_ms")) {
            e.setProperty("poll.interval.ms", a.get("poll_interval_ms"));
        }
        if (a.containsKey("max_batch_size")) {
            e.setProperty("max.batch.size", a.get("max_batch_size"));
            e.setProperty("max.queue.size", String.valueOf(4 * Integer.parseInt(a.get("max_batch_size"))));
        }

        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine
                .create(ChangeEventFormat.of(Connect.class))
                .using(e)
                .notifying(sink)
                .using((success, message, error) -> {
                    System.out.println("ENGINE_STOPPED " + success + " " + message);
                    if (error != null) {
                        error.printStackTrace();
                    }
                    System.out.flush();
                })
                .build();
        ExecutorService ex = Executors.newSingleThreadExecutor();
        ex.execute(engine);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            try {
                engine.close();
            } catch (Exception ignored) {
                // exiting anyway
            }
            producer.close();
        }));
        ex.shutdown();
        while (!ex.awaitTermination(1, java.util.concurrent.TimeUnit.SECONDS)) {
            // the engine runs until the process is stopped
        }
        producer.close();
    }

    private static byte[] bytes(Object o) {
        if (o == null) {
            return null;
        }
        if (o instanceof byte[]) {
            return (byte[]) o;
        }
        if (o instanceof java.nio.ByteBuffer) {
            java.nio.ByteBuffer b = ((java.nio.ByteBuffer) o).duplicate();
            byte[] out = new byte[b.remaining()];
            b.get(out);
            return out;
        }
        return o.toString().getBytes(StandardCharsets.UTF_8);
    }
}
