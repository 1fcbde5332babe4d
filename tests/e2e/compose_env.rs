//! docker/compose.yaml, docker/Dockerfile and the deploy/kubernetes manifests only set
//! OUTBOXD_* variables the relay knows (every one of them appears in `outboxd --help`),
//! the image runs as a non-root user, compose waits out the drain and health-checks with
//! `outboxd probe`, and the Kubernetes manifests parse and fit together: active + standby
//! replicas, probes on /readyz and /healthz, the password from a Secret the kustomization
//! does not overwrite, a PodDisruptionBudget, a NetworkPolicy and a PodMonitor selecting
//! the pods, resource requests, verify-full against the mounted CA with only SCRAM answered
//! in every workload (the weaker TLS variant labelled an example, still SCRAM-only), and the
//! sharded variant's shard count taken from its replicas. With `kubectl` on the PATH each
//! kustomization is also rendered (`kubectl kustomize`) and checked.

use std::collections::BTreeSet;
use std::process::Command;

use serde::Deserialize as _;

const COMPOSE: &str = include_str!("../../docker/compose.yaml");
const DOCKERFILE: &str = include_str!("../../docker/Dockerfile");

/// deploy/kubernetes/base, every file its kustomization.yaml lists, and the kustomization
/// itself.
const KUBERNETES: &[(&str, &str)] = &[
    (
        "kustomization.yaml",
        include_str!("../../deploy/kubernetes/base/kustomization.yaml"),
    ),
    (
        "configmap.yaml",
        include_str!("../../deploy/kubernetes/base/configmap.yaml"),
    ),
    (
        "deployment.yaml",
        include_str!("../../deploy/kubernetes/base/deployment.yaml"),
    ),
    (
        "pdb.yaml",
        include_str!("../../deploy/kubernetes/base/pdb.yaml"),
    ),
    (
        "networkpolicy.yaml",
        include_str!("../../deploy/kubernetes/base/networkpolicy.yaml"),
    ),
];
const PODMONITOR: &str = include_str!("../../deploy/kubernetes/podmonitor.yaml");
const EXAMPLE_TLS_WITHOUT_CA: &str =
    include_str!("../../deploy/kubernetes/example-tls-without-ca/kustomization.yaml");
const STATEFULSET: &str = include_str!("../../deploy/kubernetes/sharded/statefulset.yaml");
const SHARDED: &str = include_str!("../../deploy/kubernetes/sharded/kustomization.yaml");

/// Every `OUTBOXD_[A-Z0-9_]+` in `text`.
fn outboxd_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("OUTBOXD_") {
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..len].to_owned());
        rest = &tail[len..];
    }
    names
}

fn relay_help() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("cannot run outboxd --help: {e}"));
    assert!(
        out.status.success(),
        "outboxd --help failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn extracts_names() {
    let names = outboxd_names("A: OUTBOXD_TOPIC\n B=OUTBOXD_KAFKA_LINGER_MS; x OUTBOXD_X1}");
    let want: BTreeSet<String> = ["OUTBOXD_KAFKA_LINGER_MS", "OUTBOXD_TOPIC", "OUTBOXD_X1"]
        .map(String::from)
        .into();
    assert_eq!(names, want);
}

#[test]
fn compose_and_dockerfile_use_only_known_variables() {
    let compose = outboxd_names(COMPOSE);
    assert!(
        compose.contains("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS"),
        "compose.yaml must set OUTBOXD_KAFKA_BOOTSTRAP_SERVERS, found {compose:?}"
    );
    // A build argument is read by the build (cargo), not by the relay.
    let build_args: BTreeSet<String> = DOCKERFILE
        .lines()
        .filter_map(|l| l.trim().strip_prefix("ARG "))
        .filter_map(|a| a.split('=').next())
        .map(|a| a.trim().to_owned())
        .collect();
    assert!(
        build_args.contains("OUTBOXD_BUILD_COMMIT"),
        "{build_args:?}"
    );
    let dockerfile: BTreeSet<String> = outboxd_names(DOCKERFILE)
        .into_iter()
        .filter(|n| !build_args.contains(n))
        .collect();
    let help = relay_help();
    let unknown: Vec<&String> = compose
        .iter()
        .chain(&dockerfile)
        .filter(|name| !help.contains(name.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "docker/ sets variables that `outboxd --help` does not list: {unknown:?}\n--help:\n{help}"
    );
}

#[test]
fn dockerfile_runtime_stage_runs_as_non_root() {
    let runtime_stage = DOCKERFILE
        .rsplit_once("\nFROM ")
        .map(|(_, stage)| stage)
        .expect("a multi-stage Dockerfile");
    let user = runtime_stage
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("USER "))
        .expect("the runtime stage sets USER");
    let user = user.trim();
    let name = user.split(':').next().unwrap_or(user);
    assert!(
        !name.is_empty() && name != "root" && name != "0",
        "the runtime stage must run as a non-root user, found USER {user}"
    );
}

/// Every YAML document of every manifest, with its file name.
fn kubernetes_documents() -> Vec<(&'static str, serde_yaml::Value)> {
    let mut docs = Vec::new();
    for (file, text) in KUBERNETES {
        for de in serde_yaml::Deserializer::from_str(text) {
            let doc = serde_yaml::Value::deserialize(de)
                .unwrap_or_else(|e| panic!("deploy/kubernetes/{file} is not valid YAML: {e}"));
            if !doc.is_null() {
                docs.push((*file, doc));
            }
        }
    }
    docs
}

fn kind<'a>(docs: &'a [(&str, serde_yaml::Value)], kind: &str) -> &'a serde_yaml::Value {
    let found: Vec<&serde_yaml::Value> = docs
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d["kind"].as_str() == Some(kind))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} in deploy/kubernetes");
    found[0]
}

fn str_of<'a>(v: &'a serde_yaml::Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, found {v:?}"))
}

#[test]
fn kubernetes_manifests_use_only_known_variables() {
    let help = relay_help();
    let mut names = BTreeSet::new();
    for (_, text) in KUBERNETES {
        names.extend(outboxd_names(text));
    }
    assert!(
        names.contains("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS"),
        "{names:?}"
    );
    // OUTBOXD_KAFKA_<PROPERTY> is accepted for any librdkafka property (--help says so);
    // librdkafka itself refuses an unknown one when the producer is built.
    let unknown: Vec<&String> = names
        .iter()
        .filter(|name| !help.contains(name.as_str()))
        .filter(|name| {
            name.strip_prefix("OUTBOXD_KAFKA_")
                .is_none_or(str::is_empty)
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "deploy/kubernetes sets variables that `outboxd --help` does not list: {unknown:?}"
    );
    // The ConfigMap is the environment: every key is a variable outboxd reads (PG* too).
    let docs = kubernetes_documents();
    let data = kind(&docs, "ConfigMap")["data"]
        .as_mapping()
        .expect("ConfigMap data");
    for (k, v) in data {
        let k = str_of(k, "ConfigMap key");
        assert!(
            help.contains(&format!("  {k} ")),
            "ConfigMap key {k} is not a variable of `outboxd --help`"
        );
        assert!(v.is_string(), "{k}: quote values so YAML keeps them text");
    }
    // Probes and Prometheus reach the pod IP, not the loopback default.
    let addr = str_of(
        &data[&serde_yaml::Value::from("OUTBOXD_HTTP_ADDR")],
        "OUTBOXD_HTTP_ADDR",
    );
    assert!(addr.starts_with("0.0.0.0:"), "{addr}");
    assert_eq!(
        data[&serde_yaml::Value::from("OUTBOXD_READY_STANDBY")].as_str(),
        Some("true"),
        "the standby must count as ready, or rollouts and the PDB block"
    );
}

#[test]
fn kubernetes_manifests_parse_and_fit_together() {
    let docs = kubernetes_documents();
    for (file, d) in &docs {
        if file == &"kustomization.yaml" {
            let listed: Vec<&str> = d["resources"]
                .as_sequence()
                .expect("resources")
                .iter()
                .map(|r| str_of(r, "resource"))
                .collect();
            let files: Vec<&str> = KUBERNETES.iter().skip(1).map(|(f, _)| *f).collect();
            assert_eq!(listed, files, "kustomization.yaml lists every manifest");
            continue;
        }
        assert!(d["apiVersion"].is_string(), "{file}: apiVersion");
        assert!(d["metadata"]["name"].is_string(), "{file}: metadata.name");
    }
    let deployment = kind(&docs, "Deployment");
    assert_eq!(
        deployment["spec"]["replicas"].as_u64(),
        Some(2),
        "active + standby"
    );
    let pod = &deployment["spec"]["template"];
    let labels = pod["metadata"]["labels"].as_mapping().expect("pod labels");
    let selector = deployment["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("selector");
    for (k, v) in selector {
        assert_eq!(
            labels.get(k),
            Some(v),
            "the selector matches the pod labels"
        );
    }
    let containers = pod["spec"]["containers"].as_sequence().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let port = c["ports"][0]["containerPort"]
        .as_u64()
        .expect("containerPort");
    let config = kind(&docs, "ConfigMap");
    let addr = str_of(&config["data"]["OUTBOXD_HTTP_ADDR"], "OUTBOXD_HTTP_ADDR");
    assert!(addr.ends_with(&format!(":{port}")), "{addr} vs port {port}");
    let probe_port = |probe: &str| -> u64 {
        match &c[probe]["httpGet"]["port"] {
            serde_yaml::Value::Number(n) => n.as_u64().expect("port"),
            name => {
                assert_eq!(name, &c["ports"][0]["name"], "{probe} names the http port");
                port
            }
        }
    };
    assert_eq!(
        str_of(&c["readinessProbe"]["httpGet"]["path"], "readiness"),
        "/readyz"
    );
    assert_eq!(
        str_of(&c["livenessProbe"]["httpGet"]["path"], "liveness"),
        "/healthz"
    );
    assert_eq!(probe_port("readinessProbe"), port);
    assert_eq!(probe_port("livenessProbe"), port);
    // Configuration from the ConfigMap, the password from the Secret, never inline.
    assert_eq!(
        c["envFrom"][0]["configMapRef"]["name"],
        config["metadata"]["name"]
    );
    let password = c["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .find(|e| e["name"].as_str() == Some("PGPASSWORD"))
        .expect("PGPASSWORD in env");
    assert!(
        password.get("value").is_none(),
        "PGPASSWORD must not be inline"
    );
    // An existing Secret: one with a placeholder in the kustomization would overwrite the
    // real password at every `apply -k`.
    let key_ref = &password["valueFrom"]["secretKeyRef"];
    assert!(key_ref["name"].is_string() && key_ref["key"].is_string());
    assert!(
        docs.iter()
            .all(|(_, d)| d["kind"].as_str() != Some("Secret")),
        "no Secret in the kustomization"
    );
    assert!(
        config["data"].get("PGPASSWORD").is_none(),
        "no password in the ConfigMap"
    );
    // Requests sized (docs/benchmarks.md), and a memory limit above the request.
    let requests = &c["resources"]["requests"];
    assert!(
        requests["cpu"].is_string() && requests["memory"].is_string(),
        "{requests:?}"
    );
    assert!(c["resources"]["limits"]["memory"].is_string());
    // The image's non-root user, and a grace period longer than the shutdown drain.
    assert_eq!(
        pod["spec"]["securityContext"]["runAsNonRoot"].as_bool(),
        Some(true)
    );
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .expect("grace");
    let drain_ms: u64 = str_of(
        &config["data"]["OUTBOXD_SHUTDOWN_TIMEOUT_MS"],
        "OUTBOXD_SHUTDOWN_TIMEOUT_MS",
    )
    .parse()
    .expect("a number");
    assert!(
        grace * 1000 > drain_ms,
        "grace {grace}s vs drain {drain_ms} ms"
    );
    // The NetworkPolicy and the PodMonitor select these pods, and let Prometheus reach
    // the HTTP port; the PodMonitor's job is the one the alerts select.
    let policy = kind(&docs, "NetworkPolicy");
    let selects = |selector: &serde_yaml::Value, what: &str| {
        for (k, v) in selector
            .as_mapping()
            .unwrap_or_else(|| panic!("{what} selector"))
        {
            assert_eq!(labels.get(k), Some(v), "{what} selects the pods");
        }
    };
    selects(
        &policy["spec"]["podSelector"]["matchLabels"],
        "NetworkPolicy",
    );
    let ingress_ports: Vec<u64> = policy["spec"]["ingress"]
        .as_sequence()
        .expect("ingress")
        .iter()
        .flat_map(|rule| rule["ports"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|p| p["port"].as_u64())
        .collect();
    assert_eq!(ingress_ports, [port], "only the HTTP port is open");
    let monitor: serde_yaml::Value = serde_yaml::from_str(PODMONITOR).expect("podmonitor.yaml");
    assert_eq!(monitor["kind"].as_str(), Some("PodMonitor"));
    selects(&monitor["spec"]["selector"]["matchLabels"], "PodMonitor");
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["port"], c["ports"][0]["name"]);
    assert_eq!(endpoint["path"].as_str(), Some("/metrics"));
    let job_label = str_of(&monitor["spec"]["jobLabel"], "jobLabel");
    assert_eq!(
        labels.get(job_label).and_then(|v| v.as_str()),
        Some("outboxd"),
        "job=\"outboxd\", as deploy/prometheus/alerts.yaml selects"
    );
    // The PodDisruptionBudget selects these pods and leaves one running.
    let pdb = kind(&docs, "PodDisruptionBudget");
    assert_eq!(pdb["apiVersion"].as_str(), Some("policy/v1"));
    assert_eq!(pdb["spec"]["minAvailable"].as_u64(), Some(1));
    for (k, v) in pdb["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("pdb selector")
    {
        assert_eq!(labels.get(k), Some(v), "the PDB selects the pods");
    }
}

/// compose stops outboxd only after the drain, and health-checks it with `outboxd probe`
/// (the image has no curl).
#[test]
fn compose_waits_for_the_drain_and_probes_readiness() {
    let compose: serde_yaml::Value = serde_yaml::from_str(COMPOSE).expect("compose.yaml");
    let relay = &compose["services"]["outboxd"];
    let grace = str_of(&relay["stop_grace_period"], "stop_grace_period");
    let grace_ms: u64 = grace
        .strip_suffix('s')
        .and_then(|s| s.parse::<u64>().ok())
        .map(|s| s * 1000)
        .unwrap_or_else(|| panic!("stop_grace_period in seconds, e.g. 45s: {grace}"));
    let drain_ms: u64 = relay["environment"]["OUTBOXD_SHUTDOWN_TIMEOUT_MS"]
        .as_str()
        .map_or(Some(30_000), |v| v.parse().ok())
        .expect("a number");
    assert!(grace_ms > drain_ms, "grace {grace} vs drain {drain_ms} ms");
    let test: Vec<&str> = relay["healthcheck"]["test"]
        .as_sequence()
        .expect("healthcheck.test")
        .iter()
        .map(|t| str_of(t, "healthcheck.test"))
        .collect();
    assert_eq!(test, ["CMD", "/usr/local/bin/outboxd", "probe"]);
    assert!(DOCKERFILE.contains("COPY --from=builder /out/outboxd /usr/local/bin/outboxd"));
}

/// The files a pod template mounts from ConfigMaps into its first container, as paths.
fn configmap_files(pod: &serde_yaml::Value) -> Vec<String> {
    let volumes = pod["spec"]["volumes"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let mounts = pod["spec"]["containers"][0]["volumeMounts"]
        .as_sequence()
        .cloned()
        .unwrap_or_default();
    let mut files = Vec::new();
    for mount in &mounts {
        let Some(volume) = volumes.iter().find(|v| v["name"] == mount["name"]) else {
            panic!("volumeMount {:?} names no volume", mount["name"]);
        };
        let dir = str_of(&mount["mountPath"], "mountPath");
        for item in volume["configMap"]["items"]
            .as_sequence()
            .into_iter()
            .flatten()
        {
            files.push(format!("{dir}/{}", str_of(&item["path"], "item path")));
        }
    }
    files
}

/// The ConfigMap's TLS and authentication settings are the safe ones, and `pod` mounts
/// the CA file PGSSLROOTCERT names.
fn assert_verifies_the_server(data: &serde_yaml::Value, pod: &serde_yaml::Value, what: &str) {
    assert_eq!(data["PGSSLMODE"].as_str(), Some("verify-full"), "{what}");
    assert_eq!(
        data["PGREQUIREAUTH"].as_str(),
        Some("scram-sha-256"),
        "{what}: a server asking for a cleartext password must be refused"
    );
    let root = str_of(&data["PGSSLROOTCERT"], "PGSSLROOTCERT");
    assert!(
        configmap_files(pod).iter().any(|f| f == root),
        "{what}: PGSSLROOTCERT {root} is a mounted file"
    );
}

/// The default kit (the Deployment and the sharded StatefulSet): verify-full against the
/// CA mounted where PGSSLROOTCERT points, and only SCRAM answered. With `require` and no
/// PGREQUIREAUTH, a man in the middle with any certificate got the password in cleartext.
#[test]
fn the_kit_verifies_the_server_and_answers_only_scram() {
    let docs = kubernetes_documents();
    let data = &kind(&docs, "ConfigMap")["data"];
    assert_verifies_the_server(data, &kind(&docs, "Deployment")["spec"]["template"], "base");
    let sharded: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(STATEFULSET)
        .map(|de| serde_yaml::Value::deserialize(de).expect("valid YAML"))
        .collect();
    let set = sharded
        .iter()
        .find(|d| d["kind"].as_str() == Some("StatefulSet"))
        .expect("a StatefulSet");
    assert_verifies_the_server(data, &set["spec"]["template"], "sharded");
}

/// deploy/kubernetes/example-tls-without-ca: labelled a weaker example, and still never
/// sends the password (SCRAM only, bound to the TLS channel).
#[test]
fn the_weaker_tls_variant_is_a_labelled_example_that_keeps_scram() {
    assert!(
        EXAMPLE_TLS_WITHOUT_CA.starts_with("# EXAMPLE ONLY, WEAKER THAN THE DEFAULT"),
        "the variant says what it is on its first line"
    );
    let k: serde_yaml::Value = serde_yaml::from_str(EXAMPLE_TLS_WITHOUT_CA).expect("kustomization");
    let ops: Vec<serde_yaml::Value> = k["patches"]
        .as_sequence()
        .expect("patches")
        .iter()
        .flat_map(|p| {
            serde_yaml::from_str::<Vec<serde_yaml::Value>>(str_of(&p["patch"], "patch"))
                .expect("JSON 6902 patch")
        })
        .collect();
    let value = |path: &str| {
        ops.iter()
            .find(|op| op["path"].as_str() == Some(path))
            .and_then(|op| op["value"].as_str())
    };
    assert_eq!(value("/data/PGSSLMODE"), Some("require"));
    assert_eq!(value("/data/PGCHANNELBINDING"), Some("require"));
    assert!(
        ops.iter()
            .all(|op| op["path"].as_str() != Some("/data/PGREQUIREAUTH")),
        "PGREQUIREAUTH=scram-sha-256 of the base is kept"
    );
}

/// `kubectl kustomize` renders each kustomization when kubectl is installed (it is not
/// needed otherwise): the rendered sharded variant's OUTBOXD_SHARD_COUNT is its replicas.
#[test]
fn kustomizations_render() {
    let Some(kubectl) = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("kubectl"))
            .find(|p| p.is_file())
    }) else {
        eprintln!("kubectl is not installed: skipping `kubectl kustomize deploy/kubernetes/...`");
        return;
    };
    for dir in ["", "/sharded", "/example-tls-without-ca"] {
        let out = Command::new(&kubectl)
            .args(["kustomize", &format!("deploy/kubernetes{dir}")])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run kubectl");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "kubectl kustomize deploy/kubernetes{dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
            .map(|de| serde_yaml::Value::deserialize(de).expect("valid YAML"))
            .collect();
        assert!(docs.iter().all(|d| d["kind"].as_str() != Some("Secret")));
        let data = &docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("ConfigMap"))
            .expect("the ConfigMap")["data"];
        let workload = docs
            .iter()
            .find(|d| matches!(d["kind"].as_str(), Some("Deployment" | "StatefulSet")))
            .expect("the workload");
        if dir == "/example-tls-without-ca" {
            assert_eq!(data["PGREQUIREAUTH"].as_str(), Some("scram-sha-256"));
            assert_eq!(data["PGCHANNELBINDING"].as_str(), Some("require"));
            assert!(data.get("PGSSLROOTCERT").is_none(), "{text}");
            assert!(
                configmap_files(&workload["spec"]["template"]).is_empty(),
                "no CA ConfigMap to wait for: {text}"
            );
        } else {
            assert_verifies_the_server(data, &workload["spec"]["template"], dir);
        }
        if dir == "/sharded" {
            let set = docs
                .iter()
                .find(|d| d["kind"].as_str() == Some("StatefulSet"))
                .expect("the StatefulSet");
            assert!(docs
                .iter()
                .all(|d| d["kind"].as_str() != Some("Deployment")));
            let count = set["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_sequence()
                .expect("env")
                .iter()
                .find(|e| e["name"].as_str() == Some("OUTBOXD_SHARD_COUNT"))
                .and_then(|e| e["value"].as_str()?.parse::<u64>().ok());
            assert_eq!(count, set["spec"]["replicas"].as_u64(), "{text}");
        }
    }
}

/// deploy/kubernetes/sharded: one pod per shard, the ordinal picking it.
#[test]
fn the_sharded_statefulset_runs_one_pod_per_shard() {
    let text = include_str!("../../deploy/kubernetes/sharded/statefulset.yaml");
    let help = relay_help();
    for name in outboxd_names(text) {
        assert!(
            help.contains(&name),
            "{name} is not a variable of `outboxd --help`"
        );
    }
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(text)
        .map(|de| serde_yaml::Value::deserialize(de).expect("valid YAML"))
        .collect();
    let set = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("StatefulSet"))
        .expect("a StatefulSet");
    let service = docs
        .iter()
        .find(|d| d["kind"].as_str() == Some("Service"))
        .expect("its headless Service");
    assert_eq!(set["spec"]["serviceName"], service["metadata"]["name"]);
    assert_eq!(service["spec"]["clusterIP"].as_str(), Some("None"));
    let env = set["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .expect("env");
    let value = |name: &str| {
        env.iter()
            .find(|e| e["name"].as_str() == Some(name))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{name} set in the StatefulSet"))
            .to_owned()
    };
    assert_eq!(value("OUTBOXD_SHARDS"), "ordinal");
    // The count is the replicas, copied by the kustomization; the file's own value is no
    // number, so a plain `kubectl apply -f` fails loudly (exit 2) instead of relaying
    // with another count.
    assert!(set["spec"]["replicas"].as_u64().is_some_and(|n| n > 0));
    assert!(value("OUTBOXD_SHARD_COUNT").parse::<u64>().is_err());
    let k: serde_yaml::Value = serde_yaml::from_str(SHARDED).expect("kustomization");
    let copies_replicas = k["replacements"]
        .as_sequence()
        .expect("replacements")
        .iter()
        .any(|r| {
            r["source"]["kind"].as_str() == Some("StatefulSet")
                && r["source"]["name"] == set["metadata"]["name"]
                && r["source"]["fieldPath"].as_str() == Some("spec.replicas")
                && r["targets"].as_sequence().is_some_and(|t| {
                    t.iter().any(|t| {
                        t["fieldPaths"].as_sequence().is_some_and(|p| {
                            p.iter().any(|p| {
                                p.as_str().is_some_and(|p| {
                                    p.ends_with("env.[name=OUTBOXD_SHARD_COUNT].value")
                                })
                            })
                        })
                    })
                })
        });
    assert!(
        copies_replicas,
        "sharded/kustomization.yaml copies spec.replicas into OUTBOXD_SHARD_COUNT"
    );
    assert_eq!(
        set["spec"]["selector"]["matchLabels"],
        set["spec"]["template"]["metadata"]["labels"]
    );
}
