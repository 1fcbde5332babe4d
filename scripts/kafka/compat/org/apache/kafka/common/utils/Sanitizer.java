// Debezium 3.6.1.Final is built against Kafka 4.3, whose clients had this class here; Kafka
// 4.4 moved it to org.apache.kafka.common.utils.internals, so Debezium's metrics fail with
// NoClassDefFoundError on a 4.4 worker (the connector task dies at start). scripts/bench
// compiles this one forwarder onto the Connect worker's classpath until Debezium catches up.
package org.apache.kafka.common.utils;

public final class Sanitizer {
    private Sanitizer() {
    }

    public static String sanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.sanitize(name);
    }

    public static String desanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.desanitize(name);
    }

    public static String jmxSanitize(String name) {
        return org.apache.kafka.common.utils.internals.Sanitizer.jmxSanitize(name);
    }
}
