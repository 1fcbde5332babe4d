//! Every environment variable outboxd reads, with its default and meaning: the single
//! source for parsing, `outboxd --help`, and the check that docker/compose.yaml uses only
//! variables that exist.

/// One documented variable.
#[derive(Debug, Clone, Copy)]
pub struct VarSpec {
    pub name: &'static str,
    /// Shown in `--help`; `None` means "no default" (required or optional without one).
    pub default: Option<&'static str>,
    pub help: &'static str,
}

const fn var(name: &'static str, default: Option<&'static str>, help: &'static str) -> VarSpec {
    VarSpec {
        name,
        default,
        help,
    }
}

/// Variables with the `OUTBOXD_KAFKA_` prefix that are not listed here are passed to
/// librdkafka as properties (OUTBOXD_KAFKA_SASL_MECHANISM -> sasl.mechanism), mapped by
/// the relay's `kafka_property_from_env`.
pub use outboxd_relay::kafka::KAFKA_ENV_PREFIX as KAFKA_PASSTHROUGH_PREFIX;

/// Where the relay serves /metrics, /healthz and /readyz, and where `outboxd probe` asks.
pub const HTTP_ADDR_DEFAULT: &str = "127.0.0.1:9187";

pub const VARS: &[VarSpec] = &[
    // Postgres
    var("OUTBOXD_DATABASE_URL", None, "postgres://user:password@host:port/dbname?sslmode=... ; overrides the PG* variables below"),
    var("PGHOST", Some("/var/run/postgresql, else /tmp (the Unix socket)"), "host name, IP address, or Unix-socket directory; several as a,b,c are tried in order (see PGTARGETSESSIONATTRS)"),
    var("PGPORT", Some("5432"), "port, or one per host as p1,p2,p3"),
    var("PGUSER", Some("the OS user"), "role to connect as; needs the REPLICATION attribute (see sql/role.sql)"),
    var("PGPASSWORD", None, "password (trust, cleartext, md5 and SCRAM-SHA-256 are supported); never logged"),
    var("PGPASSFILE", Some("~/.pgpass"), "password file (libpq's format and rules; ignored with a warning when group or others can read it) used when PGPASSWORD is not set"),
    var("PGDATABASE", Some("the user name"), "database holding the outbox table"),
    var("PGSSLMODE", Some("prefer"), "disable | prefer | require | verify-ca | verify-full, as libpq 16+: with a root file prefer and require verify the chain; verify-ca needs a root file; verify-full is the default with PGSSLROOTCERT=system"),
    var("PGSSLROOTCERT", Some("~/.postgresql/root.crt if it exists"), "CA certificate file (PEM); `system`: the system trust store, only with verify-full (verify-full without a root file uses it too)"),
    var("PGCHANNELBINDING", Some("prefer"), "disable | prefer | require: require accepts only SCRAM-SHA-256-PLUS bound to the TLS certificate"),
    var("PGREQUIREAUTH", None, "authentication the server may ask for (libpq 16+): password, md5, scram-sha-256, gss, sspi, none, comma-separated, all negated with ! or none; e.g. scram-sha-256"),
    var("PGSSLCERT", Some("~/.postgresql/postgresql.crt if it exists"), "client certificate (PEM) for pg_hba `cert` / clientcert"),
    var("PGSSLKEY", Some("~/.postgresql/postgresql.key"), "private key of PGSSLCERT (PEM, mode 0600 or less)"),
    var("PGTARGETSESSIONATTRS", Some("primary"), "which of several hosts to use: run, init and check need the primary and accept primary, read-write or any (taken as primary); status accepts any of libpq's: any, read-write, read-only, primary, standby, prefer-standby"),
    var("PGCONNECT_TIMEOUT", Some("10"), "seconds to wait for each host; 0: wait forever"),
    var("PGSERVICE", None, "a service in PGSERVICEFILE (default ~/.pg_service.conf) or PGSYSCONFDIR/pg_service.conf (default /etc/postgresql-common); its settings win over the PG* variables"),
    var("PGSERVICEFILE", None, "the user's service file"),
    var("PGSYSCONFDIR", None, "directory of the system-wide pg_service.conf"),
    var("PGAPPNAME", Some("outboxd"), "application_name; keep it out of synchronous_standby_names"),
    var("OUTBOXD_SLOT", Some("outboxd"), "logical replication slot name"),
    var("OUTBOXD_PUBLICATION", Some("outboxd"), "publication name (CREATE PUBLICATION ... FOR TABLE <table> WITH (publish = 'insert'))"),
    var("OUTBOXD_CREATE_SLOT", Some("true"), "true: create the slot at start-up when it does not exist (logged); false: a missing slot is an error. A slot that disappears while outboxd runs is always an error"),
    var("OUTBOXD_FAILOVER_SLOT", Some("auto"), "auto: the slot is a failover slot (kept on standbys with sync_replication_slots, so it survives a promotion) when PostgreSQL is 17 or later; true: always (an error on older servers); false: never set. An existing slot is switched with ALTER_REPLICATION_SLOT at start-up and by `outboxd init`"),
    var("OUTBOXD_CHECK_STANDBYS", None, "standbys `outboxd check` verifies for failover (PostgreSQL 17+), as host[:port] separated by commas, reached with the primary's user, password, TLS settings and database: sync_replication_slots, hot_standby_feedback, primary_slot_name, a dbname in primary_conninfo, and the slot synced and persistent"),
    var("OUTBOXD_TABLE", Some("public.outbox"), "outbox table as schema.table; a partitioned table's partitions (any depth) are its rows"),
    var("OUTBOXD_SHARD_COUNT", Some("0"), "0: one table, one slot. N > 0: OUTBOXD_TABLE is partitioned BY HASH (aggregate id) into N partitions named <table>_shard_<i>, each relayed through its own slot <OUTBOXD_SLOT>_<i> and publication <OUTBOXD_PUBLICATION>_<i> (`outboxd init` creates them; see sql/shards.sql)"),
    var("OUTBOXD_SHARDS", Some("all"), "with OUTBOXD_SHARD_COUNT: the shards this process relays: all, a list such as 0,2, or ordinal (the number ending HOSTNAME, as in a StatefulSet pod outboxd-2)"),
    var("OUTBOXD_FORMER_PARTITIONS", Some(""), "schema.table entries, comma-separated: relations that were partitions of OUTBOXD_TABLE when rows were written to them and were detached or dropped before outboxd relayed those rows; their inserts still in the WAL are published as the table's. Set only as the relay's error says, and unset once the slot is confirmed past the position it names"),
    var("OUTBOXD_RELAY_TABLE", Some("true"), "false: relay only emitted logical messages (OUTBOXD_MESSAGE_PREFIX); otherwise the table must be in the publication, which is checked at start-up and while running"),
    var("OUTBOXD_COLUMN_ID", Some("id"), "column holding the event id (sent as header id)"),
    var("OUTBOXD_COLUMN_AGGREGATE_TYPE", Some("aggregate_type"), "column holding the aggregate type"),
    var("OUTBOXD_COLUMN_AGGREGATE_ID", Some("aggregate_id"), "column holding the aggregate id (the Kafka key)"),
    var("OUTBOXD_COLUMN_EVENT_TYPE", Some("event_type"), "column holding the event type"),
    var("OUTBOXD_COLUMN_PAYLOAD", Some("payload"), "column holding the payload: jsonb, json, text or bytea, sent as stored"),
    var("OUTBOXD_COLUMN_HEADERS", Some("headers"), "optional jsonb column of extra headers; empty to disable"),
    var("OUTBOXD_HEADER_COLUMNS", Some(""), "comma-separated columns each sent as a header named after the column, in its text form (NULL: header left out), e.g. idempotency_key,version; each must exist in the table. For emitted messages, the envelope's top-level fields of those names"),
    var("OUTBOXD_HEADER_FORMAT", Some("outboxd"), "outboxd: the documented headers; cloudevents: also the CloudEvents Kafka binding's binary-mode attributes (ce_specversion, ce_id, ce_source, ce_type, ce_time, content-type)"),
    var("OUTBOXD_CLOUDEVENTS_SOURCE", None, "the CloudEvents source attribute (a URI-reference such as /shop/orders); required with OUTBOXD_HEADER_FORMAT=cloudevents"),
    var("OUTBOXD_MESSAGE_PREFIX", Some(""), "off unless set: pg_logical_emit_message(true, PREFIX, ...) messages are relayed like rows (PG14+). Any role that can execute pg_logical_emit_message can then publish events: REVOKE it from PUBLIC (see sql/role.sql)"),
    // Kafka
    var("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS", None, "required: Kafka bootstrap servers, host:port[,host:port]"),
    var("OUTBOXD_TOPIC", Some("outbox.{aggregate_type}"), "topic template over {id} {aggregate_type} {aggregate_id} {event_type} and any other column as {column_name}, or one fixed topic"),
    var("OUTBOXD_BAD_ROW_POLICY", Some("dead-letter"), "dead-letter: a row that cannot be published goes to the dead-letter topic; stop: exit naming the row"),
    var("OUTBOXD_DEAD_LETTER_TOPIC", Some("outbox.dead-letter"), "topic for rows that cannot be published"),
    var("OUTBOXD_MAX_MESSAGE_BYTES", Some("1000000"), "largest record outboxd produces; keep <= the broker's message.max.bytes"),
    var("OUTBOXD_KAFKA_LINGER_MS", Some("5"), "producer linger.ms"),
    // Flow control and progress
    var("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", Some("30000"), "cap on produced-but-unacked messages; at the cap outboxd stops reading WAL (status updates continue)"),
    var("OUTBOXD_MAX_IN_FLIGHT_BYTES", Some("268435456"), "cap on produced-but-unacked bytes"),
    var("OUTBOXD_PGOUTPUT_BINARY", Some("auto"), "auto: ask pgoutput for binary column values (lighter for the walsender) when every column outboxd reads has a type it decodes to the same bytes (text, varchar, char, name, uuid, smallint, integer, bigint, boolean, json, jsonb, bytea, timestamptz) under the server's settings (timestamptz needs DateStyle ISO and a UTC TimeZone, printed bytea needs bytea_output hex), text otherwise; with OUTBOXD_BAD_ROW_POLICY=dead-letter every column is read. on: binary, and an error naming the column when it cannot be; off: text. Records are byte for byte the same in both modes"),
    var("OUTBOXD_STATUS_INTERVAL_MS", None, "status update interval; default min(10 s, wal_sender_timeout / 2)"),
    var("OUTBOXD_IDLE_FLUSH", Some("true"), "advance the slot from keepalives while nothing is open or unacked, so idle outboxes do not retain WAL"),
    var("OUTBOXD_HEARTBEAT_INTERVAL_MS", Some("0"), "if > 0, emit a transactional logical message this often so the slot advances even without keepalives"),
    var("OUTBOXD_SHUTDOWN_TIMEOUT_MS", Some("30000"), "on SIGTERM/SIGINT, how long to wait for in-flight acks"),
    var("OUTBOXD_PROGRESS_TOPIC", Some("outboxd.progress"), "compacted topic holding one progress record per slot (created if missing, one partition); it is how outboxd knows a missing slot existed before and refuses to recreate it. Empty disables it, and then only `outboxd init` creates a missing slot"),
    var("OUTBOXD_PROGRESS_INTERVAL_MS", Some("1000"), "how often the progress record is brought up to what is acked (the confirmed position, and the acked leading rows of a transaction in flight); after a crash, what was acked since the last record is sent again"),
    var("OUTBOXD_CLUSTER_NAME", Some(""), "a name for this copy of the cluster, put into the progress record's key: copies of one cluster (a clone, a disk snapshot, a restored backup started as a primary) share a system identifier, so two of them sharing one Kafka and progress topic need different names (letters, digits, '.', '_', '-')"),
    var("OUTBOXD_PUBLICATION_CHECK_INTERVAL_MS", Some("5000"), "how often the publication is compared with what outboxd saw last (a change, even one undone, stops outboxd: docs/operations.md, The publication changed); the slot is confirmed only up to the last look that matched, so this is also how far the confirmed position may trail what Kafka acknowledged"),
    var("OUTBOXD_PROGRESS_READ_WAIT_MS", Some("3000"), "how long a stream start waits for the progress record before it gives up skipping: what PostgreSQL sends again is then published again (counted in outboxd_progress_record_unread_total); the stream waits meanwhile, so a longer wait only delays a start whose broker is slow. With OUTBOXD_DELIVERY=exactly-once and this unset: OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS plus 30000, at least 90000 (giving up would put duplicates into read_committed)"),
    var("OUTBOXD_DELIVERY", Some("at-least-once"), "at-least-once | exactly-once. exactly-once: events go out in Kafka transactions with the progress record as their last record, the slot is confirmed only after a commit, and an instance that takes the slot over fences the one before (docs/transactional-mode.md); consumers must read with isolation.level=read_committed. Needs OUTBOXD_PROGRESS_TOPIC and brokers with transactions"),
    var("OUTBOXD_TXN_COMMIT_MS", Some("100"), "exactly-once: commit the Kafka transaction at the first PostgreSQL commit this long after the previous commit began, less how long commits take (about the latency read_committed consumers add)"),
    var("OUTBOXD_TXN_MAX_EVENTS", Some("10000"), "exactly-once: or at the first PostgreSQL commit after this many events"),
    var("OUTBOXD_RECONNECT_MAX_BACKOFF_MS", Some("30000"), "cap of the exponential reconnect backoff"),
    // Operations
    var("OUTBOXD_HTTP_ADDR", Some(HTTP_ADDR_DEFAULT), "address for /metrics, /healthz, /readyz; empty disables"),
    var("OUTBOXD_READY_STANDBY", Some("false"), "true: a standby waiting for the slot held by another instance answers /readyz with 200, so Kubernetes rollouts and PodDisruptionBudgets (which count ready pods) work with active + standby replicas; false: it answers 503"),
    var("OUTBOXD_READY_STALL_MS", Some("60000"), "/readyz fails when work is unacked and the confirmed LSN has not moved for this long"),
    var("OUTBOXD_LOG", Some("info"), "log filter (tracing EnvFilter syntax, e.g. info,librdkafka=warn)"),
    var("OUTBOXD_LOG_FORMAT", Some("text"), "text | json"),
    var("OUTBOXD_STATUS_FORMAT", Some("text"), "output of `outboxd status`: text | json (same as `outboxd status --json`)"),
];

pub fn spec(name: &str) -> Option<&'static VarSpec> {
    VARS.iter().find(|v| v.name == name)
}

/// `outboxd --help` text for the variables.
pub fn help_text() -> String {
    let mut out = String::from("Environment variables:\n");
    for v in VARS {
        let default = v
            .default
            .map_or(String::new(), |d| format!(" [default: {d}]"));
        out.push_str(&format!("  {:<34} {}{}\n", v.name, v.help, default));
    }
    out.push_str(&format!(
        "  {:<34} any other librdkafka property, e.g. OUTBOXD_KAFKA_SASL_MECHANISM -> sasl.mechanism\n",
        "OUTBOXD_KAFKA_<PROPERTY>"
    ));
    out
}
