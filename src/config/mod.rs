//! The one place that reads environment variables. Parsing is a pure function over a
//! snapshot of the environment so every rule is unit-tested; a bad value names the
//! variable and what it accepts, and the binary exits with code 2.

mod database_url;
pub mod libpq;
mod shards;
mod vars;

use std::collections::BTreeMap;
use std::time::Duration;

use outbox_core::{InFlightCaps, OutboxColumns};
use outboxd_relay::kafka::{
    is_secret_property, kafka_property_from_env, ProducerSettings, Transactions,
    QUEUE_MAX_KBYTES_DEFAULT,
};
use outboxd_relay::pipeline::ShardSpec;
use pgrepl::ConnectConfig;

pub use shards::{shard_table, Shards};
#[cfg(test)]
pub use vars::VARS;
pub use vars::{help_text, spec, HTTP_ADDR_DEFAULT, KAFKA_PASSTHROUGH_PREFIX};

/// What a bad variable looked like and what would have been accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={shown:?} is invalid: {accepts}")]
pub struct ConfigError {
    pub var: String,
    /// The value as given, or "***" for secrets.
    pub shown: String,
    pub accepts: String,
}

impl ConfigError {
    pub fn new(var: &str, value: &str, accepts: impl Into<String>) -> Self {
        // A Kafka property is a secret by the relay's one rule (it redacts the same ones).
        let secret = var.contains("PASSWORD")
            || var.contains("SECRET")
            || var == "OUTBOXD_DATABASE_URL"
            || kafka_property_from_env(var).is_some_and(|p| is_secret_property(&p));
        ConfigError {
            var: var.to_owned(),
            shown: if secret {
                "***".into()
            } else {
                value.to_owned()
            },
            accepts: accepts.into(),
        }
    }
}

pub use pgrepl::SslMode;

/// libpq's `sslmode` through the one parser (pgrepl's). `allow` (plaintext first, TLS
/// only if the server insists) is refused rather than silently treated as `prefer`.
pub fn parse_ssl_mode(var: &str, s: &str) -> Result<SslMode, ConfigError> {
    if s.trim().eq_ignore_ascii_case("allow") {
        return Err(ConfigError::new(
            var,
            s,
            "disable, prefer, require, verify-ca or verify-full (allow is not supported: it tries plaintext first; use prefer or stronger)",
        ));
    }
    s.parse::<SslMode>()
        .map_err(|_| ConfigError::new(var, s, "disable, prefer, require, verify-ca or verify-full"))
}

/// `OUTBOXD_BAD_ROW_POLICY`: the relay's own type, parsed here.
pub use outboxd_relay::pipeline::BadRowPolicy;

/// `OUTBOXD_HEADER_FORMAT`: outbox-core's type, parsed here.
pub use outbox_core::HeaderFormat;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFormat {
    Text,
    Json,
}

/// OUTBOXD_CHECK_STANDBYS: `host[:port]` entries separated by commas (the port defaults
/// to the primary's).
fn standby_list(env: &Env<'_>) -> Result<Vec<(String, Option<u16>)>, ConfigError> {
    const NAME: &str = "OUTBOXD_CHECK_STANDBYS";
    const ACCEPTS: &str = "host[:port] entries separated by commas";
    let Some(text) = env.string(NAME) else {
        return Ok(Vec::new());
    };
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| match entry.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() => port
                .parse()
                .map(|p| (host.to_owned(), Some(p)))
                .map_err(|_| ConfigError::new(NAME, entry, ACCEPTS)),
            Some(_) => Err(ConfigError::new(NAME, entry, ACCEPTS)),
            None => Ok((entry.to_owned(), None)),
        })
        .collect()
}

/// `OUTBOXD_FAILOVER_SLOT`: the relay's own type, parsed here.
pub use outboxd_relay::pipeline::FailoverSlot;

/// `OUTBOXD_PGOUTPUT_BINARY`: outbox-core's type, parsed here.
pub use outbox_core::BinaryMode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Everything outboxd was told, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Where and how to reach Postgres (libpq's variables, service file and
    /// `OUTBOXD_DATABASE_URL`). `target_session_attrs` is PGTARGETSESSIONATTRS as given, else
    /// `primary`; `run`, `init` and `check` narrow it (see `wiring::connect_config`).
    pub pg: ConnectConfig,
    pub slot: String,
    pub publication: String,
    pub create_slot: bool,
    pub failover_slot: FailoverSlot,
    pub pgoutput_binary: BinaryMode,
    /// Standbys `outboxd check` verifies for failover: (host, port or the primary's).
    pub check_standbys: Vec<(String, Option<u16>)>,
    pub table_schema: String,
    pub table_name: String,
    /// `OUTBOXD_COLUMN_*` and `OUTBOXD_HEADER_COLUMNS`. A headers column is never
    /// required: the name has a default, and a table without it has no row headers.
    pub columns: OutboxColumns,
    pub header_format: HeaderFormat,
    pub message_prefix: Option<String>,
    /// false: emitted messages only (an explicit choice).
    pub relay_table: bool,
    /// The brokers, `OUTBOXD_KAFKA_<PROPERTY>` overrides (values may be secrets: `Debug`
    /// redacts them), `OUTBOXD_MAX_MESSAGE_BYTES` (the rules' limit too),
    /// `OUTBOXD_KAFKA_LINGER_MS` and `OUTBOXD_DELIVERY=exactly-once`'s commit settings.
    /// `bootstrap_servers` is empty when `init` or `status` were not given it.
    pub producer: ProducerSettings,
    pub topic_template: String,
    pub bad_row_policy: BadRowPolicy,
    pub dead_letter_topic: String,
    pub caps: InFlightCaps,
    pub status_interval: Option<Duration>,
    pub idle_flush: bool,
    /// See `outbox_core::CoreConfig::former_partitions`.
    pub former_partitions: Vec<String>,
    pub heartbeat_interval: Option<Duration>,
    pub shutdown_timeout: Duration,
    pub reconnect_max_backoff: Duration,
    pub progress_topic: Option<String>,
    pub progress_interval: Duration,
    pub progress_read_wait: Duration,
    pub publication_check_interval: Duration,
    /// Goes into the progress record's key: keeps copies of one cluster apart.
    pub cluster_name: String,
    pub http_addr: Option<String>,
    pub ready_stall: Duration,
    pub ready_standby: bool,
    pub log_filter: String,
    pub log_format: LogFormat,
    pub status_format: StatusFormat,
    /// OUTBOXD_SHARD_COUNT / OUTBOXD_SHARDS; `None`: one outbox table, one slot.
    pub shards: Option<Shards>,
    /// Set on the settings of one shard (`Settings::per_shard`): slot, publication and
    /// table are that shard's.
    pub shard: Option<ShardSpec>,
}

impl Settings {
    /// The outbox table as SQL names it (quoted as needed): for the statements outboxd
    /// runs and the ones it prints.
    pub fn table(&self) -> String {
        outbox_core::pgtype::qualified(&self.table_schema, &self.table_name)
    }
}

/// A snapshot of the environment with typed getters that fall back to the documented default.
struct Env<'a> {
    vars: &'a BTreeMap<String, String>,
}

impl Env<'_> {
    fn raw(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// The value, else the default from the table. Empty means "unset" for libpq variables.
    fn string(&self, name: &str) -> Option<String> {
        match self.raw(name) {
            Some(v) => Some(v.to_owned()),
            None => spec(name).and_then(|s| s.default).map(str::to_owned),
        }
    }

    fn required(&self, name: &str, accepts: &str) -> Result<String, ConfigError> {
        match self.string(name) {
            Some(v) if !v.trim().is_empty() => Ok(v),
            _ => Err(ConfigError::new(name, "", format!("required: {accepts}"))),
        }
    }

    fn number<T>(&self, name: &str, min: T) -> Result<T, ConfigError>
    where
        T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
    {
        let v = self.required(name, "a number")?;
        match v.trim().parse::<T>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(ConfigError::new(
                name,
                &v,
                format!("a whole number >= {min}"),
            )),
        }
    }

    fn millis(&self, name: &str, min: u64) -> Result<Duration, ConfigError> {
        self.number::<u64>(name, min).map(Duration::from_millis)
    }

    fn boolean(&self, name: &str) -> Result<bool, ConfigError> {
        let v = self.required(name, "true or false")?;
        match v.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(ConfigError::new(name, &v, "true or false")),
        }
    }

    fn identifier(&self, name: &str) -> Result<String, ConfigError> {
        let v = self.required(name, "a Postgres identifier")?;
        if v.len() > 63 || v.contains('"') || v.contains('\0') {
            return Err(ConfigError::new(
                name,
                &v,
                "a Postgres identifier of at most 63 bytes without double quotes",
            ));
        }
        Ok(v)
    }

    fn optional_identifier(&self, name: &str) -> Result<Option<String>, ConfigError> {
        match self.string(name) {
            Some(v) if v.trim().is_empty() => Ok(None),
            None => Ok(None),
            Some(_) => self.identifier(name).map(Some),
        }
    }
}

/// OUTBOXD_FORMER_PARTITIONS: `schema.table` (or `table`, in public) entries separated by
/// commas, as the relay's error names them (`outbox_core::pgtype::setting_name`).
fn former_partitions(env: &Env<'_>) -> Result<Vec<String>, ConfigError> {
    const NAME: &str = "OUTBOXD_FORMER_PARTITIONS";
    let raw = env.string(NAME).unwrap_or_default();
    outbox_core::pgtype::parse_setting_names(&raw).ok_or_else(|| {
        ConfigError::new(
            NAME,
            &raw,
            "schema.table entries separated by commas, as the error names them (a name with \
             '.', ',' or '\"' in double quotes)",
        )
    })
}

/// The headers outboxd itself sets: a header column of one of these names would be
/// shadowed (consumers read the last header of a name).
const RESERVED_HEADERS: &[&str] = &["id", "event_type", "aggregate_type", "content-type"];

fn header_columns(env: &Env<'_>) -> Result<Vec<String>, ConfigError> {
    let name = "OUTBOXD_HEADER_COLUMNS";
    let raw = env.string(name).unwrap_or_default();
    let mut out: Vec<String> = Vec::new();
    for col in raw.split(',').map(str::trim).filter(|c| !c.is_empty()) {
        let bad = |why: &str| {
            ConfigError::new(
                name,
                &raw,
                format!("comma-separated column names; {col:?} {why}"),
            )
        };
        if col.len() > 63 || col.contains('"') || col.contains('\0') {
            return Err(bad(
                "is not a Postgres identifier of at most 63 bytes without double quotes",
            ));
        }
        if RESERVED_HEADERS.contains(&col) || col.starts_with("outboxd.") || col.starts_with("ce_")
        {
            return Err(bad("is a header outboxd sets itself (id, event_type, aggregate_type, content-type, outboxd.*, ce_*)"));
        }
        if out.iter().any(|c| c == col) {
            return Err(bad("is listed twice"));
        }
        out.push(col.to_owned());
    }
    Ok(out)
}

fn header_format(env: &Env<'_>) -> Result<HeaderFormat, ConfigError> {
    let format = env.required("OUTBOXD_HEADER_FORMAT", "outboxd or cloudevents")?;
    let source = env
        .raw("OUTBOXD_CLOUDEVENTS_SOURCE")
        .map(str::trim)
        .filter(|s| !s.is_empty());
    match format.trim().to_ascii_lowercase().as_str() {
        "outboxd" => Ok(HeaderFormat::Outboxd),
        "cloudevents" => {
            let Some(source) = source else {
                return Err(ConfigError::new(
                    "OUTBOXD_CLOUDEVENTS_SOURCE",
                    "",
                    "required with OUTBOXD_HEADER_FORMAT=cloudevents: a URI-reference naming the producer, e.g. /shop/orders or urn:shop:orders",
                ));
            };
            if source.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(ConfigError::new(
                    "OUTBOXD_CLOUDEVENTS_SOURCE",
                    source,
                    "a URI-reference without spaces, e.g. /shop/orders or urn:shop:orders",
                ));
            }
            Ok(HeaderFormat::CloudEvents {
                source: source.to_owned().into_bytes().into(),
            })
        }
        _ => Err(ConfigError::new(
            "OUTBOXD_HEADER_FORMAT",
            &format,
            "outboxd or cloudevents",
        )),
    }
}

/// Slot names are restricted by Postgres to lower-case letters, digits and underscores.
fn cluster_name(env: &Env<'_>) -> Result<String, ConfigError> {
    let v = env.string("OUTBOXD_CLUSTER_NAME").unwrap_or_default();
    let ok = v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(v)
    } else {
        Err(ConfigError::new(
            "OUTBOXD_CLUSTER_NAME",
            &v,
            "at most 63 characters from A-Z, a-z, 0-9, '.', '_' and '-'",
        ))
    }
}

fn slot_name(env: &Env<'_>) -> Result<String, ConfigError> {
    let v = env.required("OUTBOXD_SLOT", "a slot name")?;
    let ok = !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(v)
    } else {
        Err(ConfigError::new(
            "OUTBOXD_SLOT",
            &v,
            "1-63 characters from a-z, 0-9 and _ (Postgres slot-name rules)",
        ))
    }
}

fn table(env: &Env<'_>) -> Result<(String, String), ConfigError> {
    let v = env.required("OUTBOXD_TABLE", "schema.table")?;
    let (schema, name) = v.split_once('.').unwrap_or(("public", v.as_str()));
    let valid = |s: &str| !s.is_empty() && s.len() <= 63 && !s.contains('"') && !s.contains('.');
    if valid(schema) && valid(name) {
        Ok((schema.to_owned(), name.to_owned()))
    } else {
        Err(ConfigError::new(
            "OUTBOXD_TABLE",
            &v,
            "schema.table or table (unquoted, as stored in the catalog)",
        ))
    }
}

fn pg_settings(env: &Env<'_>) -> Result<ConnectConfig, ConfigError> {
    libpq::resolve(env.vars, &libpq::Home::of_process(env.vars))
}

/// Parses a snapshot of the environment for a command that talks to Kafka.
#[cfg(test)]
pub fn from_vars(vars: &BTreeMap<String, String>) -> Result<Settings, ConfigError> {
    from_vars_for(vars, true)
}

/// Parses a snapshot of the environment. `needs_kafka` false (`init`, `status`): the
/// brokers may be left unset, since those commands only talk to PostgreSQL.
pub fn from_vars_for(
    vars: &BTreeMap<String, String>,
    needs_kafka: bool,
) -> Result<Settings, ConfigError> {
    let env = Env { vars };
    for name in vars.keys() {
        if name.starts_with("OUTBOXD_")
            && spec(name).is_none()
            && !name.starts_with(KAFKA_PASSTHROUGH_PREFIX)
        {
            return Err(ConfigError::new(
                name,
                "",
                "unknown variable (a typo?); `outboxd --help` lists every variable",
            ));
        }
    }
    let (table_schema, table_name) = table(&env)?;
    let failover_slot = {
        let v = env.required("OUTBOXD_FAILOVER_SLOT", "auto, true or false")?;
        match v.to_ascii_lowercase().as_str() {
            "auto" => FailoverSlot::Auto,
            "true" | "1" | "yes" | "on" => FailoverSlot::On,
            "false" | "0" | "no" | "off" => FailoverSlot::Off,
            _ => {
                return Err(ConfigError::new(
                    "OUTBOXD_FAILOVER_SLOT",
                    &v,
                    "auto, true or false",
                ))
            }
        }
    };
    let pgoutput_binary = {
        let v = env.required("OUTBOXD_PGOUTPUT_BINARY", "auto, on or off")?;
        match v.to_ascii_lowercase().as_str() {
            "auto" => BinaryMode::Auto,
            "on" | "true" => BinaryMode::On,
            "off" | "false" => BinaryMode::Off,
            _ => {
                return Err(ConfigError::new(
                    "OUTBOXD_PGOUTPUT_BINARY",
                    &v,
                    "auto (binary values when they give the same records), on or off",
                ))
            }
        }
    };
    let bad_row_policy = match env.required("OUTBOXD_BAD_ROW_POLICY", "a policy")?.as_str() {
        "dead-letter" => BadRowPolicy::DeadLetter,
        "stop" => BadRowPolicy::Stop,
        other => {
            return Err(ConfigError::new(
                "OUTBOXD_BAD_ROW_POLICY",
                other,
                "dead-letter or stop",
            ))
        }
    };
    let status_format = match env.required("OUTBOXD_STATUS_FORMAT", "a format")?.as_str() {
        "text" => StatusFormat::Text,
        "json" => StatusFormat::Json,
        other => {
            return Err(ConfigError::new(
                "OUTBOXD_STATUS_FORMAT",
                other,
                "text or json",
            ))
        }
    };
    let log_format = match env.required("OUTBOXD_LOG_FORMAT", "a format")?.as_str() {
        "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => {
            return Err(ConfigError::new(
                "OUTBOXD_LOG_FORMAT",
                other,
                "text or json",
            ))
        }
    };
    let nonzero_millis = |name: &str| -> Result<Option<Duration>, ConfigError> {
        match env.string(name) {
            None => Ok(None),
            Some(v) if v.trim().is_empty() => Ok(None),
            Some(_) => env.millis(name, 0).map(|d| (!d.is_zero()).then_some(d)),
        }
    };
    let mut kafka_overrides = BTreeMap::new();
    for (name, value) in vars {
        if name.starts_with(KAFKA_PASSTHROUGH_PREFIX) {
            if spec(name).is_some() {
                continue;
            }
            let Some(property) = kafka_property_from_env(name) else {
                return Err(ConfigError::new(
                    name,
                    value,
                    "OUTBOXD_KAFKA_<PROPERTY>, the librdkafka property in capitals with _ for . \
                     (OUTBOXD_KAFKA_SASL_MECHANISM -> sasl.mechanism)",
                ));
            };
            kafka_overrides.insert(property, value.clone());
        }
    }
    let status_interval = nonzero_millis("OUTBOXD_STATUS_INTERVAL_MS")?;
    let transactions = transactions(&env)?;
    let progress_read_wait = progress_read_wait(&env, transactions.is_some(), &kafka_overrides)?;
    let relay_table = env.boolean("OUTBOXD_RELAY_TABLE")?;
    let message_prefix = env
        .string("OUTBOXD_MESSAGE_PREFIX")
        .filter(|p| !p.is_empty());
    if !relay_table && message_prefix.is_none() {
        return Err(ConfigError::new(
            "OUTBOXD_RELAY_TABLE",
            "false",
            "true, or false together with OUTBOXD_MESSAGE_PREFIX (otherwise nothing is relayed)",
        ));
    }
    // Emitted messages are in the WAL alone: after a lost slot only the progress record
    // tells a slot that existed from a new one, so without it `outboxd init` would create
    // the slot again as new and say nothing of the messages Kafka lacked.
    let progress_topic = progress_topic(&env);
    if message_prefix.is_some() && progress_topic.is_none() {
        return Err(ConfigError::new(
            "OUTBOXD_PROGRESS_TOPIC",
            "",
            "a topic while OUTBOXD_MESSAGE_PREFIX is set: emitted messages are in no table, so \
             only the progress record tells a lost slot from a new one (otherwise `outboxd \
             init` recreates it silently, losing the messages Kafka lacked)",
        ));
    }
    // Of two bad variables the one judged first is named, so the order is kept: the
    // connection, slot and table, the brokers, the topics, then the producer's sizes.
    let pg = pg_settings(&env)?;
    let slot = slot_name(&env)?;
    let publication = env.identifier("OUTBOXD_PUBLICATION")?;
    let create_slot = env.boolean("OUTBOXD_CREATE_SLOT")?;
    let check_standbys = standby_list(&env)?;
    let columns = OutboxColumns {
        id: env.identifier("OUTBOXD_COLUMN_ID")?,
        aggregate_type: env.identifier("OUTBOXD_COLUMN_AGGREGATE_TYPE")?,
        aggregate_id: env.identifier("OUTBOXD_COLUMN_AGGREGATE_ID")?,
        event_type: env.identifier("OUTBOXD_COLUMN_EVENT_TYPE")?,
        payload: env.identifier("OUTBOXD_COLUMN_PAYLOAD")?,
        headers_required: false,
        headers: env.optional_identifier("OUTBOXD_COLUMN_HEADERS")?,
        header_columns: header_columns(&env)?,
    };
    let header_format = header_format(&env)?;
    let bootstrap_servers = if needs_kafka {
        env.required(
            "OUTBOXD_KAFKA_BOOTSTRAP_SERVERS",
            "Kafka bootstrap servers as host:port[,host:port]",
        )?
    } else {
        env.string("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS")
            .unwrap_or_default()
    };
    let mut settings = Settings {
        pg,
        slot,
        publication,
        create_slot,
        failover_slot,
        pgoutput_binary,
        check_standbys,
        table_schema,
        table_name,
        columns,
        header_format,
        message_prefix,
        relay_table,
        topic_template: env.required("OUTBOXD_TOPIC", "a topic or topic template")?,
        bad_row_policy,
        dead_letter_topic: env.required("OUTBOXD_DEAD_LETTER_TOPIC", "a topic name")?,
        producer: ProducerSettings {
            overrides: kafka_overrides,
            max_message_bytes: env.number::<usize>("OUTBOXD_MAX_MESSAGE_BYTES", 1024)?,
            linger_ms: env.number::<u32>("OUTBOXD_KAFKA_LINGER_MS", 0)?,
            transactions,
            ..ProducerSettings::new(bootstrap_servers)
        },
        caps: InFlightCaps {
            max_messages: env.number::<usize>("OUTBOXD_MAX_IN_FLIGHT_MESSAGES", 1)?,
            max_bytes: env.number::<usize>("OUTBOXD_MAX_IN_FLIGHT_BYTES", 1024)?,
        },
        status_interval,
        idle_flush: env.boolean("OUTBOXD_IDLE_FLUSH")?,
        former_partitions: former_partitions(&env)?,
        heartbeat_interval: nonzero_millis("OUTBOXD_HEARTBEAT_INTERVAL_MS")?,
        shutdown_timeout: env.millis("OUTBOXD_SHUTDOWN_TIMEOUT_MS", 0)?,
        reconnect_max_backoff: env.millis("OUTBOXD_RECONNECT_MAX_BACKOFF_MS", 100)?,
        progress_topic,
        progress_interval: env.millis("OUTBOXD_PROGRESS_INTERVAL_MS", 100)?,
        progress_read_wait,
        publication_check_interval: env.millis("OUTBOXD_PUBLICATION_CHECK_INTERVAL_MS", 1000)?,
        cluster_name: cluster_name(&env)?,
        http_addr: env
            .string("OUTBOXD_HTTP_ADDR")
            .filter(|a| !a.trim().is_empty()),
        ready_stall: env.millis("OUTBOXD_READY_STALL_MS", 1000)?,
        ready_standby: env.boolean("OUTBOXD_READY_STANDBY")?,
        log_filter: env.required("OUTBOXD_LOG", "a log filter")?,
        log_format,
        status_format,
        shards: shards::shards(&env)?,
        shard: None,
    };
    // librdkafka's queue must never be the binding limit: ours is, and it is observable.
    settings.producer.queue_max_messages = settings.caps.max_messages.saturating_add(1000);
    // Nor its byte bound: the caps let one message past the byte cap, and a dead letter
    // may follow a refused one.
    let needed = settings
        .caps
        .max_bytes
        .saturating_add(settings.producer.max_message_bytes.saturating_mul(2))
        .div_ceil(1024)
        .saturating_add(1024);
    settings.producer.queue_max_kbytes = needed.max(QUEUE_MAX_KBYTES_DEFAULT);
    shards::validate(&settings)?;
    Ok(settings)
}

/// How long a stream start waits for the progress record. Exactly-once, unset: long enough
/// for the broker to abort another instance's transaction left open on the progress topic
/// (`transaction.timeout.ms`, and the broker's check every 10 s), which holds the record's
/// last stable offset back: at least 90 s, and the timeout plus 30 s. Giving up publishes
/// the replay again, which is a duplicate in `read_committed` in this mode, where waiting
/// costs only time.
fn progress_read_wait(
    env: &Env<'_>,
    exactly_once: bool,
    kafka_overrides: &BTreeMap<String, String>,
) -> Result<Duration, ConfigError> {
    const NAME: &str = "OUTBOXD_PROGRESS_READ_WAIT_MS";
    match (env.raw(NAME), exactly_once) {
        (None, true) => {
            let expiry = outboxd_relay::kafka::transaction_timeout_in(kafka_overrides)
                .saturating_add(Duration::from_secs(30));
            Ok(expiry.max(Duration::from_secs(90)))
        }
        _ => env.millis(NAME, 0),
    }
}

/// `OUTBOXD_PROGRESS_TOPIC`; `None`: empty, no progress record is kept.
fn progress_topic(env: &Env<'_>) -> Option<String> {
    env.string("OUTBOXD_PROGRESS_TOPIC")
        .filter(|t| !t.trim().is_empty())
}

/// `OUTBOXD_DELIVERY` and the commit settings of its exactly-once mode.
fn transactions(env: &Env<'_>) -> Result<Option<Transactions>, ConfigError> {
    match env
        .required("OUTBOXD_DELIVERY", "a delivery mode")?
        .as_str()
    {
        "at-least-once" => Ok(None),
        "exactly-once" => {
            if progress_topic(env).is_none() {
                return Err(ConfigError::new(
                    "OUTBOXD_DELIVERY",
                    "exactly-once",
                    "at-least-once while OUTBOXD_PROGRESS_TOPIC is empty: the exactly-once mode writes what Kafka has into the progress record; set OUTBOXD_PROGRESS_TOPIC",
                ));
            }
            Ok(Some(Transactions {
                commit_every: env.millis("OUTBOXD_TXN_COMMIT_MS", 1)?,
                commit_events: env.number::<usize>("OUTBOXD_TXN_MAX_EVENTS", 1)?,
            }))
        }
        other => Err(ConfigError::new(
            "OUTBOXD_DELIVERY",
            other,
            "at-least-once or exactly-once",
        )),
    }
}

/// Reads the process environment once.
pub fn from_process_env(needs_kafka: bool) -> Result<Settings, ConfigError> {
    let mut vars: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect();
    // Shells keep HOSTNAME unexported; OUTBOXD_SHARDS=ordinal reads it.
    if !vars.contains_key("HOSTNAME") {
        if let Ok(name) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
            vars.insert("HOSTNAME".into(), name.trim().to_owned());
        }
    }
    from_vars_for(&vars, needs_kafka)
}

#[cfg(test)]
mod tests;
