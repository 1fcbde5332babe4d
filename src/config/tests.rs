use std::collections::BTreeMap;

use super::*;

fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    m.entry("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS".into())
        .or_insert_with(|| "127.0.0.1:9092".into());
    m
}

#[test]
fn defaults_apply_when_only_bootstrap_is_set() {
    let s = from_vars(&vars(&[])).unwrap();
    assert_eq!(s.slot, "outboxd");
    assert_eq!(
        (s.table_schema.as_str(), s.table_name.as_str()),
        ("public", "outbox")
    );
    assert_eq!(s.topic_template, "outbox.{aggregate_type}");
    assert_eq!(s.bad_row_policy, BadRowPolicy::DeadLetter);
    assert_eq!(s.pgoutput_binary, super::BinaryMode::Auto);
    assert_eq!(s.columns.headers.as_deref(), Some("headers"));
    assert!(
        s.message_prefix.is_none(),
        "emitted messages are off unless configured"
    );
    assert!(s.relay_table);
    assert_eq!(s.progress_topic.as_deref(), Some("outboxd.progress"));
    assert_eq!(s.pg.port, 5432);
    assert!(s.idle_flush);
    assert!(s.heartbeat_interval.is_none());
    assert!(
        s.producer.overrides.is_empty(),
        "{:?}",
        s.producer.overrides
    );
}

#[test]
fn missing_bootstrap_servers_names_the_variable() {
    let mut v = vars(&[]);
    v.remove("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS");
    let e = from_vars(&v).unwrap_err();
    assert_eq!(e.var, "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS");
    assert!(e.to_string().contains("required"), "{e}");
}

#[test]
fn bad_values_name_the_variable_and_what_it_accepts() {
    let cases = [
        ("OUTBOXD_BAD_ROW_POLICY", "skip", "dead-letter or stop"),
        ("OUTBOXD_FAILOVER_SLOT", "maybe", "auto, true or false"),
        (
            "OUTBOXD_PGOUTPUT_BINARY",
            "sometimes",
            "auto (binary values",
        ),
        ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "0", ">= 1"),
        ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "lots", "whole number"),
        ("PGSSLMODE", "maybe", "verify-full"),
        ("OUTBOXD_SLOT", "My-Slot", "a-z, 0-9 and _"),
        ("OUTBOXD_IDLE_FLUSH", "perhaps", "true or false"),
        ("OUTBOXD_TABLE", "a.b.c", "schema.table"),
        ("OUTBOXD_LOG_FORMAT", "xml", "text or json"),
        ("OUTBOXD_TYPO_VAR", "1", "unknown variable"),
    ];
    for (var, value, accepts) in cases {
        let e = from_vars(&vars(&[(var, value)])).unwrap_err();
        assert_eq!(e.var, var, "{e}");
        assert!(e.to_string().contains(accepts), "{var}: {e}");
    }
}

#[test]
fn kafka_passthrough_maps_names_to_librdkafka_properties() {
    let s = from_vars(&vars(&[
        ("OUTBOXD_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512"),
        ("OUTBOXD_KAFKA_SECURITY_PROTOCOL", "sasl_ssl"),
        ("OUTBOXD_KAFKA_LINGER_MS", "20"),
    ]))
    .unwrap();
    assert_eq!(
        s.producer.overrides.get("sasl.mechanism").unwrap(),
        "SCRAM-SHA-512"
    );
    assert_eq!(
        s.producer.overrides.get("security.protocol").unwrap(),
        "sasl_ssl"
    );
    // A documented variable is not passed through twice.
    assert!(!s.producer.overrides.contains_key("linger.ms"));
    assert_eq!(s.producer.linger_ms, 20);
}

#[test]
fn kafka_passthrough_refuses_names_that_are_no_property_and_hides_secret_values() {
    for name in ["OUTBOXD_KAFKA_SASL__MECHANISM", "OUTBOXD_KAFKA_DEBUG_"] {
        let e = from_vars(&vars(&[(name, "x")])).unwrap_err();
        assert_eq!(e.var, name);
        assert!(e.to_string().contains("sasl.mechanism"), "{e}");
    }
    // The relay redacts sasl.oauthbearer.config; so does a configuration error naming it.
    let e = ConfigError::new(
        "OUTBOXD_KAFKA_SASL_OAUTHBEARER_CONFIG",
        "secret=s3cr3t",
        "x",
    );
    assert_eq!(e.shown, "***");
}

#[test]
fn database_url_overrides_pg_variables_and_secrets_stay_hidden() {
    let s = from_vars(&vars(&[
        ("PGHOST", "ignored"),
        (
            "OUTBOXD_DATABASE_URL",
            "postgres://relay:p%40ss@db.internal:6543/shop?sslmode=require&application_name=relay1",
        ),
    ]))
    .unwrap();
    assert_eq!(s.pg.host, "db.internal");
    assert_eq!(s.pg.port, 6543);
    assert_eq!(s.pg.user, "relay");
    assert_eq!(
        s.pg.password.as_ref().map(pgrepl::Password::expose),
        Some("p@ss")
    );
    assert_eq!(s.pg.dbname, "shop");
    assert_eq!(s.pg.ssl_mode, SslMode::Require);
    assert_eq!(s.pg.application_name, "relay1");
    assert!(!format!("{:?}", s.pg).contains("p@ss"));
    let e = from_vars(&vars(&[("OUTBOXD_DATABASE_URL", "mysql://secret@x")])).unwrap_err();
    assert!(!e.to_string().contains("secret"), "{e}");
}

#[test]
fn empty_headers_column_and_prefix_disable_them() {
    let s = from_vars(&vars(&[
        ("OUTBOXD_COLUMN_HEADERS", ""),
        ("OUTBOXD_MESSAGE_PREFIX", ""),
        ("OUTBOXD_HEARTBEAT_INTERVAL_MS", "5000"),
    ]))
    .unwrap();
    assert!(s.columns.headers.is_none());
    assert!(s.message_prefix.is_none());
    assert_eq!(
        s.heartbeat_interval,
        Some(std::time::Duration::from_secs(5))
    );
}

#[test]
fn help_lists_every_variable_with_its_default() {
    let help = help_text();
    for v in VARS {
        assert!(help.contains(v.name), "{} missing from --help", v.name);
        if let Some(d) = v.default {
            assert!(help.contains(&format!("[default: {d}]")), "{}", v.name);
        }
    }
}

#[test]
fn sslmode_allow_is_refused_not_downgraded() {
    for (k, v) in [
        ("PGSSLMODE", "allow"),
        ("OUTBOXD_DATABASE_URL", "postgres://u@h/db?sslmode=allow"),
    ] {
        let e = from_vars(&vars(&[(k, v)])).unwrap_err();
        assert!(e.to_string().contains("allow is not supported"), "{e}");
    }
}

#[test]
fn header_columns_and_format() {
    let s = from_vars(&vars(&[])).unwrap();
    assert!(s.columns.header_columns.is_empty());
    assert_eq!(s.header_format, HeaderFormat::Outboxd);
    assert_eq!(s.status_format, StatusFormat::Text);
    let s = from_vars(&vars(&[
        ("OUTBOXD_HEADER_COLUMNS", " idempotency_key, version ,"),
        ("OUTBOXD_HEADER_FORMAT", "cloudevents"),
        ("OUTBOXD_CLOUDEVENTS_SOURCE", "/shop/orders"),
        ("OUTBOXD_STATUS_FORMAT", "json"),
    ]))
    .unwrap();
    assert_eq!(s.columns.header_columns, ["idempotency_key", "version"]);
    assert_eq!(
        s.header_format,
        HeaderFormat::CloudEvents {
            source: "/shop/orders".into()
        }
    );
    assert_eq!(s.status_format, StatusFormat::Json);
    for (pairs, var, needle) in [
        (
            vec![("OUTBOXD_HEADER_FORMAT", "cloudevents")],
            "OUTBOXD_CLOUDEVENTS_SOURCE",
            "required",
        ),
        (
            vec![
                ("OUTBOXD_HEADER_FORMAT", "cloudevents"),
                ("OUTBOXD_CLOUDEVENTS_SOURCE", "a b"),
            ],
            "OUTBOXD_CLOUDEVENTS_SOURCE",
            "URI-reference",
        ),
        (
            vec![("OUTBOXD_HEADER_FORMAT", "ce")],
            "OUTBOXD_HEADER_FORMAT",
            "cloudevents",
        ),
        (
            vec![("OUTBOXD_HEADER_COLUMNS", "id")],
            "OUTBOXD_HEADER_COLUMNS",
            "outboxd sets itself",
        ),
        (
            vec![("OUTBOXD_HEADER_COLUMNS", "a,a")],
            "OUTBOXD_HEADER_COLUMNS",
            "twice",
        ),
        (
            vec![("OUTBOXD_STATUS_FORMAT", "yaml")],
            "OUTBOXD_STATUS_FORMAT",
            "text or json",
        ),
    ] {
        let e = from_vars(&vars(&pairs)).unwrap_err();
        assert_eq!(e.var, var, "{e}");
        assert!(e.accepts.contains(needle), "{e}");
    }
}

/// In exactly-once mode a record not read in time means duplicates in `read_committed`:
/// the start waits longer unless told otherwise.
#[test]
fn exactly_once_waits_longer_for_the_progress_record_by_default() {
    let wait = |pairs: &[(&str, &str)]| from_vars(&vars(pairs)).unwrap().progress_read_wait;
    assert_eq!(wait(&[]), Duration::from_secs(3));
    let eos = ("OUTBOXD_DELIVERY", "exactly-once");
    assert_eq!(wait(&[eos]), Duration::from_secs(90));
    assert_eq!(
        wait(&[eos, ("OUTBOXD_PROGRESS_READ_WAIT_MS", "5000")]),
        Duration::from_secs(5)
    );
    // A raised transaction timeout: another instance's open transaction lasts that long.
    assert_eq!(
        wait(&[eos, ("OUTBOXD_KAFKA_TRANSACTION_TIMEOUT_MS", "300000")]),
        Duration::from_secs(330)
    );
}

#[test]
fn the_in_flight_cap_binds_before_librdkafkas_queue() {
    let s = from_vars(&vars(&[
        ("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", "250000"),
        ("OUTBOXD_MAX_IN_FLIGHT_BYTES", "4294967296"),
        ("OUTBOXD_MAX_MESSAGE_BYTES", "104857600"),
    ]))
    .unwrap();
    assert!(
        s.producer.queue_max_messages > s.caps.max_messages,
        "queue.buffering.max.messages {} <= OUTBOXD_MAX_IN_FLIGHT_MESSAGES {}",
        s.producer.queue_max_messages,
        s.caps.max_messages
    );
    // The byte cap lets one message past it.
    assert!(
        s.producer.queue_max_kbytes * 1024 >= s.caps.max_bytes + s.producer.max_message_bytes,
        "queue.buffering.max.kbytes {} below 4 GiB and a 100 MiB message",
        s.producer.queue_max_kbytes
    );
    let s = from_vars(&vars(&[])).unwrap();
    assert_eq!(
        s.producer.queue_max_kbytes, 1_048_576,
        "librdkafka's default"
    );
}

/// Emitted messages are in no table: only the progress record tells `outboxd init` that a
/// missing slot existed, so relaying them without one is refused (a review's finding: an
/// emit-only relay's lost slot was recreated silently).
#[test]
fn emitted_messages_need_the_progress_record() {
    let e = from_vars(&vars(&[
        ("OUTBOXD_MESSAGE_PREFIX", "outbox"),
        ("OUTBOXD_PROGRESS_TOPIC", ""),
    ]))
    .unwrap_err();
    assert_eq!(e.var, "OUTBOXD_PROGRESS_TOPIC", "{e}");
    assert!(e.to_string().contains("recreates it silently"), "{e}");
    let emit_only = from_vars(&vars(&[
        ("OUTBOXD_MESSAGE_PREFIX", "outbox"),
        ("OUTBOXD_RELAY_TABLE", "false"),
        ("OUTBOXD_PROGRESS_TOPIC", " "),
    ]));
    assert!(emit_only.is_err());
    assert!(from_vars(&vars(&[("OUTBOXD_MESSAGE_PREFIX", "outbox")])).is_ok());
    assert!(from_vars(&vars(&[("OUTBOXD_PROGRESS_TOPIC", "")])).is_ok());
}

#[test]
fn former_partitions_are_schema_qualified_as_the_error_names_them() {
    let s = from_vars(&vars(&[(
        "OUTBOXD_FORMER_PARTITIONS",
        " public.outbox_2025, outbox_2026_h0 ,",
    )]))
    .unwrap();
    assert_eq!(
        s.former_partitions,
        ["public.outbox_2025", "public.outbox_2026_h0"]
    );
    let s = from_vars(&vars(&[(
        "OUTBOXD_FORMER_PARTITIONS",
        "Sales.\"outbox.2025\",\"a,b\".\"q\"\"\"",
    )]))
    .unwrap();
    assert_eq!(
        s.former_partitions,
        ["Sales.\"outbox.2025\"", "\"a,b\".\"q\"\"\""]
    );
    let e = from_vars(&vars(&[("OUTBOXD_FORMER_PARTITIONS", "\"Outbox.old")])).unwrap_err();
    assert!(e.to_string().contains("OUTBOXD_FORMER_PARTITIONS"), "{e}");
}
