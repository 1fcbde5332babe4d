//! Apache Kafka (KRaft) as plain JVM processes: one combined broker+controller node, or
//! three that form one quorum, each on its own loopback ports with its own log directory,
//! started from the jars `scripts/install-deps --kafka` fetched with Maven.
//!
//! Each node runs under a small shell wrapper whose standard input is a pipe held by this
//! process: when the pipe closes (the cluster is dropped, the test panicked, or the test
//! process was killed and ran no destructors) the wrapper kills the JVM and removes the
//! node's files. Statics are never dropped, so the shared cluster relies on that alone.
//!
//! A node keeps its ports and its log directory across a kill and a restart, the way a
//! broker on a host keeps its address and disk: a restarted node recovers its log and
//! rejoins, and clients find it where it was.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

use crate::{io, Error, Result};

/// The Kafka release the harness expects (the pom's `kafka.version`).
pub const KAFKA_VERSION: &str = "4.4.0";

/// Where the jars are: `$OUTBOXD_KAFKA_LIBS`, else what `scripts/install-deps --kafka`
/// installed.
pub const LIBS_ENV: &str = "OUTBOXD_KAFKA_LIBS";
const DEFAULT_LIBS: &str = "/opt/outboxd-kafka/4.4.0/libs";

/// How long a node may take to start and be seen by the others (about 3 s when quiet; a
/// loaded two-core CI machine running JVMs, PostgreSQL servers and relays needs more).
const START_LIMIT: Duration = Duration::from_secs(120);

/// Partitions of `__transaction_state` (`transaction.state.log.num.partitions`): which one
/// holds a transactional.id, and so which broker coordinates it, follows from it.
const TRANSACTION_STATE_PARTITIONS: i32 = 4;

/// How a node's JVM compiles. Tests start dozens of short-lived nodes that carry little
/// traffic, on a two-core machine where their start competes with PostgreSQL and the
/// relays; a benchmark starts one and pushes it hard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jit {
    /// C1 only (`-XX:TieredStopAtLevel=1`). Measured on a two-core machine like CI's: a
    /// node's format 1.8 CPU-s instead of 2.7, its start 4.1 instead of 7.5, idle 30 s 1.1
    /// instead of 1.4; nine outage tests 213 s instead of 331 s, 351 CPU-s instead of 589.
    QuickStart,
    /// The JVM's default tiered compilation (C2 once warm): full speed for benchmarks.
    Throughput,
}

impl Jit {
    fn jvm_flags(self) -> &'static [&'static str] {
        match self {
            Jit::QuickStart => &["-XX:TieredStopAtLevel=1"],
            Jit::Throughput => &[],
        }
    }
}

/// Logs warnings and errors only, to the file the wrapper gives the JVM's standard output.
const LOG4J2: &str = "\
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
appender.stdout.type = Console
appender.stdout.name = STDOUT
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
";

/// The jar directory, or an error naming the command that installs it:
/// `$OUTBOXD_KAFKA_LIBS`, else `$OUTBOXD_KAFKA_ROOT/<version>/libs` (where
/// `scripts/install-deps --kafka` put them), else the default root's.
pub fn find_libs() -> Result<PathBuf> {
    let dir = match (std::env::var(LIBS_ENV), std::env::var("OUTBOXD_KAFKA_ROOT")) {
        (Ok(p), _) if !p.is_empty() => PathBuf::from(p),
        (_, Ok(root)) if !root.is_empty() => Path::new(&root).join(KAFKA_VERSION).join("libs"),
        _ => PathBuf::from(DEFAULT_LIBS),
    };
    let has_broker = std::fs::read_dir(&dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("kafka_2.13-{KAFKA_VERSION}"))
            })
        })
        .unwrap_or(false);
    if has_broker {
        Ok(dir)
    } else {
        Err(Error::NoKafka(dir.display().to_string()))
    }
}

/// Whether Kafka can be started here: the jars are installed and `java` runs.
pub fn available() -> bool {
    find_libs().is_ok() && java_runs()
}

fn java() -> PathBuf {
    match std::env::var("JAVA_HOME") {
        Ok(home) if !home.is_empty() => Path::new(&home).join("bin/java"),
        _ => PathBuf::from("java"),
    }
}

/// `java -version` runs and says 17 or later (Kafka 4's brokers need 17).
fn java_runs() -> bool {
    let Ok(out) = Command::new(java()).arg("-version").output() else {
        return false;
    };
    // `openjdk version "17.0.15" 2025-04-15` (on stderr); "1.8.0_x" for Java 8.
    let text = String::from_utf8_lossy(&out.stderr);
    let major = text
        .split('"')
        .nth(1)
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse::<u32>().ok());
    out.status.success() && major.is_some_and(|m| m >= 17)
}

/// Removes the directories of clusters whose test process is gone (killed before its
/// nodes' wrappers existed, e.g. while formatting).
fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("outboxd-kafka-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !alive(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A Kafka cluster id: 16 random bytes, base64url without padding (what
/// `kafka-storage random-uuid` prints).
fn cluster_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut bytes = Vec::with_capacity(16);
    for salt in 0..2u64 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        bytes.extend_from_slice(&h.finish().to_be_bytes());
    }
    let mut out = String::with_capacity(22);
    let mut acc = 0u32;
    let mut bits = 0u32;
    for b in bytes {
        acc = ((acc << 8) | u32::from(b)) & 0xFFFF;
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(base64_digit(acc >> bits));
        }
    }
    if bits > 0 {
        out.push(base64_digit(acc << (6 - bits)));
    }
    out
}

fn base64_digit(v: u32) -> char {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let i = usize::try_from(v & 63).unwrap_or(0);
    char::from(ALPHABET[i])
}

/// One node: its id (1-based), ports and files, and its JVM while it runs.
struct Node {
    id: i32,
    port: u16,
    dir: PathBuf,
    running: Option<Running>,
}

struct Running {
    wrapper: Child,
    /// Closing it tells the wrapper to kill the JVM.
    lifeline: ChildStdin,
    java_pid: u32,
}

impl Node {
    fn properties(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("broker.log")
    }

    /// The last lines the node logged, for an error that says why it did not come up.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

/// A running Apache Kafka cluster of one or three KRaft nodes on loopback.
pub struct KafkaCluster {
    root: PathBuf,
    libs: PathBuf,
    jit: Jit,
    nodes: Mutex<Vec<Node>>,
    bootstrap: String,
}

impl KafkaCluster {
    /// A fresh cluster of `nodes` combined broker+controller nodes (1 or 3), once every
    /// node is registered and unfenced. Internal topics are replicated to every node
    /// (min ISR 2 with three), so transactions work on one node and survive one lost
    /// node of three; topics are never created automatically.
    pub fn start(nodes: usize) -> Result<KafkaCluster> {
        Self::start_with(nodes, "", Jit::QuickStart)
    }

    /// [`KafkaCluster::start`] with `extra` lines of server.properties, which override
    /// the defaults (e.g. `auto.create.topics.enable=true`, a broker like a
    /// development one), and JVMs compiling as `jit` says.
    pub fn start_with(nodes: usize, extra: &str, jit: Jit) -> Result<KafkaCluster> {
        let libs = find_libs()?;
        if !java_runs() {
            return Err(Error::NoJava);
        }
        sweep_stale_dirs();
        let root = std::env::temp_dir().join(format!(
            "outboxd-kafka-{}-{}",
            std::process::id(),
            crate::free_port()?
        ));
        std::fs::create_dir_all(&root).map_err(io(format!("creating {}", root.display())))?;
        std::fs::write(root.join("log4j2.properties"), LOG4J2)
            .map_err(io("writing log4j2.properties"))?;
        let controller_ports = (0..nodes)
            .map(|_| crate::free_port())
            .collect::<Result<Vec<u16>>>()?;
        let voters = controller_ports
            .iter()
            .enumerate()
            .map(|(i, p)| format!("{}@127.0.0.1:{p}", i + 1))
            .collect::<Vec<_>>()
            .join(",");
        let replication = nodes.min(3);
        let min_isr = if replication >= 3 { 2 } else { 1 };
        let mut list = Vec::with_capacity(nodes);
        for (i, controller_port) in controller_ports.iter().enumerate() {
            let id = i32::try_from(i + 1).unwrap_or(i32::MAX);
            let port = crate::free_port()?;
            let dir = root.join(format!("node{id}"));
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
            let props = format!(
                "process.roles=broker,controller
node.id={id}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data}
auto.create.topics.enable=false
num.partitions=1
default.replication.factor={replication}
offsets.topic.replication.factor={replication}
offsets.topic.num.partitions=4
transaction.state.log.replication.factor={replication}
transaction.state.log.min.isr={min_isr}
transaction.state.log.num.partitions={TRANSACTION_STATE_PARTITIONS}
share.coordinator.state.topic.replication.factor={replication}
share.coordinator.state.topic.min.isr={min_isr}
group.initial.rebalance.delay.ms=0
broker.heartbeat.interval.ms=1000
broker.session.timeout.ms=9000
num.network.threads=2
num.io.threads=4
num.recovery.threads.per.data.dir=1
log.cleaner.threads=1
{extra}
",
                data = dir.join("data").display(),
            );
            std::fs::write(dir.join("server.properties"), props)
                .map_err(io("writing server.properties"))?;
            list.push(Node {
                id,
                port,
                dir,
                running: None,
            });
        }
        let bootstrap = list
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",");
        let cluster = KafkaCluster {
            root,
            libs,
            jit,
            nodes: Mutex::new(list),
            bootstrap,
        };
        cluster.format()?;
        for id in cluster.node_ids() {
            cluster.spawn(id)?;
        }
        cluster.wait_brokers(nodes, START_LIMIT)?;
        Ok(cluster)
    }

    /// One single-node cluster for every test of this process that needs no broker of its
    /// own (each test makes its own topics); started on first use.
    pub fn shared() -> Result<Arc<KafkaCluster>> {
        static SHARED: OnceLock<Mutex<Option<Arc<KafkaCluster>>>> = OnceLock::new();
        let slot = SHARED.get_or_init(|| Mutex::new(None));
        let mut guard = slot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = guard.as_ref() {
            return Ok(Arc::clone(c));
        }
        let cluster = Arc::new(KafkaCluster::start(1)?);
        *guard = Some(Arc::clone(&cluster));
        Ok(cluster)
    }

    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    /// The nodes' ids, 1..=n (a node's id is also its broker id).
    pub fn node_ids(&self) -> Vec<i32> {
        self.lock().iter().map(|n| n.id).collect()
    }

    /// The JVM's pid of a running node (for a test's own signals).
    pub fn pid(&self, id: i32) -> Option<u32> {
        self.lock()
            .iter()
            .find(|n| n.id == id)
            .and_then(|n| n.running.as_ref().map(|r| r.java_pid))
    }

    /// What node `id` has logged (warnings and errors): the broker's own word on what it
    /// refused, e.g. a write that lacked in-sync replicas.
    pub fn log_text(&self, id: i32) -> Result<String> {
        let path = self
            .lock()
            .iter()
            .find(|n| n.id == id)
            .map(Node::log)
            .ok_or(Error::NoSuchNode(id))?;
        std::fs::read_to_string(&path).map_err(io(format!("reading {}", path.display())))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Node>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn java_command(&self, main: &str) -> Command {
        let mut cmd = Command::new(java());
        cmd.args([
            "-Xms128m",
            "-Xmx512m",
            // Fewer GC threads on a small machine; pauses are short at this heap size.
            "-XX:+UseSerialGC",
            "-Djava.awt.headless=true",
        ])
        .args(self.jit.jvm_flags())
        // A JVM killed -9 leaves its native libraries' copies in its temporary directory:
        // the cluster's own, removed with it.
        .arg(format!("-Djava.io.tmpdir={}", self.root.display()))
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            self.root.join("log4j2.properties").display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", self.libs.display()))
        .arg(main);
        cmd
    }

    /// `kafka-storage format` for every node, at once (a JVM start each).
    fn format(&self) -> Result<()> {
        let id = cluster_id();
        let mut children = Vec::new();
        for node in self.lock().iter() {
            let mut cmd = self.java_command("kafka.tools.StorageTool");
            // `=`: a cluster id may start with '-', which the tool would read as an option.
            cmd.arg("format")
                .arg(format!("--cluster-id={id}"))
                .arg(format!("--config={}", node.properties().display()))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            children.push(cmd.spawn().map_err(io("running kafka.tools.StorageTool"))?);
        }
        for child in children {
            let out = child
                .wait_with_output()
                .map_err(io("waiting for kafka.tools.StorageTool"))?;
            if !out.status.success() {
                return Err(Error::KafkaCommand {
                    what: "kafka.tools.StorageTool format".into(),
                    detail: String::from_utf8_lossy(&out.stderr).into_owned(),
                });
            }
        }
        Ok(())
    }

    /// Starts node `id`'s JVM under its wrapper (no wait). A node already running is left.
    fn spawn(&self, id: i32) -> Result<()> {
        let mut nodes = self.lock();
        let node = nodes
            .iter_mut()
            .find(|n| n.id == id)
            .ok_or(Error::NoSuchNode(id))?;
        if node.running.is_some() {
            return Ok(());
        }
        let java = self.java_command("kafka.Kafka");
        let mut line: Vec<String> = vec![java.get_program().to_string_lossy().into_owned()];
        line.extend(java.get_args().map(|a| a.to_string_lossy().into_owned()));
        line.push(node.properties().display().to_string());
        let quoted: Vec<String> = line.iter().map(|a| shell_quote(a)).collect();
        // The JVM reads nothing; the wrapper waits for its own stdin to end, then kills
        // the JVM and removes the cluster's files, unless the test said `keep` first (a
        // node it kills to restart later). Its own process group: a Ctrl-C to the test
        // run must not kill the wrapper before it kills the JVM (sh starts background
        // jobs with SIGINT ignored, so the JVM would outlive everything).
        let script = format!(
            "{java} </dev/null >>{log} 2>&1 & j=$!; echo $j; word=; IFS= read -r word; cat >/dev/null; kill -9 $j 2>/dev/null; wait $j 2>/dev/null; [ \"$word\" = keep ] || rm -rf {root}",
            java = quoted.join(" "),
            log = shell_quote(&node.log().display().to_string()),
            root = shell_quote(&self.root.display().to_string()),
        );
        let mut wrapper = Command::new("sh")
            .process_group(0)
            .args(["-c", &script])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("starting a Kafka node"))?;
        let mut pid_line = String::new();
        if let Some(out) = wrapper.stdout.take() {
            BufReader::new(out)
                .read_line(&mut pid_line)
                .map_err(io("reading the Kafka node's pid"))?;
        }
        let (Some(lifeline), Ok(java_pid)) = (wrapper.stdin.take(), pid_line.trim().parse()) else {
            let _ = wrapper.kill();
            let _ = wrapper.wait();
            return Err(Error::KafkaCommand {
                what: format!("starting Kafka node {id}"),
                detail: format!("the wrapper printed {pid_line:?}, not a pid"),
            });
        };
        node.running = Some(Running {
            wrapper,
            lifeline,
            java_pid,
        });
        Ok(())
    }

    /// Waits until `count` brokers are registered and unfenced (a metadata request lists
    /// only those), every running node answers, for at most `limit`.
    pub fn wait_brokers(&self, count: usize, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let running: Vec<(i32, String)> = self
                .lock()
                .iter()
                .filter(|n| n.running.is_some())
                .map(|n| (n.id, format!("127.0.0.1:{}", n.port)))
                .collect();
            let mut ready = true;
            for (_, address) in &running {
                match broker_count(address) {
                    Some(n) if n >= count => {}
                    _ => {
                        ready = false;
                        break;
                    }
                }
            }
            if ready {
                return Ok(());
            }
            if let Some((id, detail)) = self.exited_node() {
                return Err(Error::KafkaCommand {
                    what: format!("Kafka node {id} exited while starting"),
                    detail,
                });
            }
            if Instant::now() >= deadline {
                let tails: Vec<String> = self
                    .lock()
                    .iter()
                    .map(|n| format!("node {}:\n{}", n.id, n.log_tail()))
                    .collect();
                return Err(Error::KafkaCommand {
                    what: format!("waiting {limit:?} for {count} Kafka brokers"),
                    detail: tails.join("\n"),
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A node whose JVM is gone though it should be running, with its log's tail.
    fn exited_node(&self) -> Option<(i32, String)> {
        let mut nodes = self.lock();
        for node in nodes.iter_mut() {
            if let Some(r) = node.running.as_mut() {
                if matches!(r.wrapper.try_wait(), Ok(Some(_))) || !alive(r.java_pid) {
                    let tail = node.log_tail();
                    return Some((node.id, tail));
                }
            }
        }
        None
    }

    /// kill -9 of node `id`'s JVM (a crashed broker); its files stay for a restart.
    pub fn kill(&self, id: i32) -> Result<()> {
        let running = {
            let mut nodes = self.lock();
            let node = nodes
                .iter_mut()
                .find(|n| n.id == id)
                .ok_or(Error::NoSuchNode(id))?;
            node.running.take()
        };
        if let Some(mut r) = running {
            signal("KILL", r.java_pid)?;
            // Keep the files for a restart.
            let _ = r.lifeline.write_all(b"keep\n");
            drop(r.lifeline);
            let _ = r.wrapper.wait();
        }
        Ok(())
    }

    /// Starts killed nodes again on their ports and log directories, all at once (one node
    /// of a cluster that lost its quorum cannot register alone), and waits until every
    /// running node lists `expect_brokers` brokers.
    pub fn restart(&self, ids: &[i32], expect_brokers: usize) -> Result<()> {
        for &id in ids {
            self.spawn(id)?;
        }
        self.wait_brokers(expect_brokers, START_LIMIT)
    }

    /// Every node killed (down) or restarted (up), as one outage of the whole cluster.
    pub fn set_all_down(&self, down: bool) -> Result<()> {
        let ids = self.node_ids();
        if down {
            for id in ids {
                self.kill(id)?;
            }
            Ok(())
        } else {
            for &id in &ids {
                self.spawn(id)?;
            }
            self.wait_brokers(ids.len(), START_LIMIT)
        }
    }

    /// SIGSTOP (a hung broker: connections stay open, nothing answers) or SIGCONT.
    pub fn set_paused(&self, id: i32, paused: bool) -> Result<()> {
        let pid = self.pid(id).ok_or(Error::NoSuchNode(id))?;
        signal(if paused { "STOP" } else { "CONT" }, pid)
    }

    /// The broker leading `topic`'s `partition`, as the metadata says now.
    pub fn leader(&self, topic: &str, partition: i32) -> Result<i32> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &self.bootstrap)
            .create()?;
        let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
        md.topics()
            .iter()
            .find(|t| t.name() == topic)
            .and_then(|t| t.partitions().iter().find(|p| p.id() == partition))
            .map(|p| p.leader())
            .filter(|l| *l >= 0)
            .ok_or_else(|| Error::KafkaCommand {
                what: format!("finding the leader of {topic}/{partition}"),
                detail: "no leader in the metadata".into(),
            })
    }

    /// The broker coordinating `transactional_id`'s transactions now: the leader of its
    /// partition of `__transaction_state` (which exists once a producer has called
    /// `init_transactions`).
    pub fn transaction_coordinator(&self, transactional_id: &str) -> Result<i32> {
        self.leader(
            "__transaction_state",
            transaction_state_partition(transactional_id),
        )
    }

    /// Sets one topic config (e.g. `min.insync.replicas=2`); see [`set_topic_config`].
    pub async fn set_topic_config(&self, topic: &str, key: &str, value: &str) -> Result<()> {
        set_topic_config(&self.bootstrap, topic, key, value).await
    }
}

/// Kafka's `TransactionStateManager.partitionFor`: the id's Java `String.hashCode` (over
/// UTF-16 units, wrapping), made non-negative by `Utils.abs` (which maps `i32::MIN` to 0),
/// modulo the partitions of `__transaction_state`.
fn transaction_state_partition(transactional_id: &str) -> i32 {
    let hash = transactional_id.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    });
    let non_negative = if hash == i32::MIN { 0 } else { hash.abs() };
    non_negative % TRANSACTION_STATE_PARTITIONS
}

/// Sets one topic config on the cluster at `bootstrap` (IncrementalAlterConfigs is not
/// in librdkafka's admin API; AlterConfigs replaces the topic's other overrides, which
/// the tests' topics do not have).
pub async fn set_topic_config(bootstrap: &str, topic: &str, key: &str, value: &str) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()?;
    let config = AlterConfig::new(ResourceSpecifier::Topic(topic)).set(key, value);
    let results = admin
        .alter_configs(
            &[config],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
        )
        .await?;
    for r in results {
        if let Err((_, code)) = r {
            return Err(Error::KafkaCommand {
                what: format!("setting {key}={value} on {topic}"),
                detail: format!("{code:?}"),
            });
        }
    }
    // The change reaches the brokers through the metadata log a moment after the answer:
    // a client that describes the topic at once (outboxd checking its progress topic's
    // cleanup.policy) could still see the old value.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let described = admin
            .describe_configs(
                &[ResourceSpecifier::Topic(topic)],
                &AdminOptions::new().request_timeout(Some(Duration::from_secs(5))),
            )
            .await?;
        let seen = described.iter().flatten().any(|resource| {
            resource
                .get(key)
                .is_some_and(|entry| entry.value.as_deref() == Some(value))
        });
        if seen {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::KafkaCommand {
                what: format!("waiting for {key}={value} on {topic}"),
                detail: "the brokers still describe another value".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

impl Drop for KafkaCluster {
    fn drop(&mut self) {
        let mut nodes = self.lock();
        let mut wrappers = Vec::new();
        for node in nodes.iter_mut() {
            if let Some(r) = node.running.take() {
                let _ = signal("KILL", r.java_pid);
                wrappers.push(r.wrapper);
            }
        }
        drop(nodes);
        for mut w in wrappers {
            let _ = w.wait();
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// How many brokers the one at `address` lists, if it answers.
fn broker_count(address: &str) -> Option<usize> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", address)
        .create()
        .ok()?;
    let md = consumer.fetch_metadata(None, Duration::from_secs(2)).ok()?;
    // Only the node itself must answer: librdkafka may ask any broker it knows.
    Some(md.brokers().len())
}

fn alive(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn signal(name: &str, pid: u32) -> Result<()> {
    let out = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .output()
        .map_err(io("running kill"))?;
    if out.status.success() {
        Ok(())
    } else {
        let mut detail = String::new();
        let _ = (&out.stderr[..]).read_to_string(&mut detail);
        Err(Error::KafkaCommand {
            what: format!("kill -{name} {pid}"),
            detail,
        })
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactional_ids_map_to_partitions_as_java_hashes_them() {
        // Java: "hello".hashCode() == 99162322; "polygenelubricants".hashCode() ==
        // Integer.MIN_VALUE, which Utils.abs makes 0.
        assert_eq!(transaction_state_partition("hello"), 99_162_322 % 4);
        assert_eq!(transaction_state_partition("polygenelubricants"), 0);
        assert_eq!(transaction_state_partition(""), 0);
    }

    #[test]
    fn cluster_ids_are_22_base64url_characters_and_differ() {
        let a = cluster_id();
        let b = cluster_id();
        assert_eq!(a.len(), 22);
        assert!(a
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'));
        assert_ne!(a, b);
    }
}
