//! Authentication methods and TLS modes on a dedicated cluster with per-role pg_hba lines.

use std::path::PathBuf;

use pgrepl::{ConnectConfig, ErrorClass, Password, ReplError, ReplicationConnection, SslMode};
use pgtest::{ClusterOptions, PgCluster};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};

struct Pki {
    ca_pem: String,
    server_cert_pem: String,
    server_key_pem: String,
}

/// A CA and a server certificate whose only name is DNS "localhost".
fn pki() -> Pki {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "pgrepl test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key).expect("ca cert");
    let server_key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).expect("server params");
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let server = params
        .signed_by(&server_key, &ca, &ca_key)
        .expect("server cert");
    Pki {
        ca_pem: ca.pem(),
        server_cert_pem: server.pem(),
        server_key_pem: server_key.serialize_pem(),
    }
}

fn role_config(
    cluster: &PgCluster,
    host: &str,
    user: &str,
    password: Option<&str>,
    mode: SslMode,
) -> ConnectConfig {
    let mut cfg = ConnectConfig::new(host, cluster.port(), user, "postgres");
    cfg.password = password.map(Password::from);
    cfg.ssl_mode = mode;
    cfg
}

async fn connect_ok(cfg: &ConnectConfig, method: &str) {
    let mut repl = ReplicationConnection::connect(cfg)
        .await
        .unwrap_or_else(|e| panic!("connect as {}: {e}", cfg.user));
    let system = repl.identify_system().await.expect("identify_system");
    assert_eq!(system.dbname.as_deref(), Some("postgres"));
    assert_eq!(repl.user(), cfg.user);
    assert_eq!(repl.auth_method(), method, "user {}", cfg.user);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_methods_and_tls_modes() {
    let pki = pki();
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec![
            "ssl = on".into(),
            "ssl_cert_file = 'server.crt'".into(),
            "ssl_key_file = 'server.key'".into(),
        ],
        hba: vec![
            "host all trust_role 127.0.0.1/32 trust".into(),
            "host all md5_role 127.0.0.1/32 md5".into(),
            "host all scram_role 127.0.0.1/32 scram-sha-256".into(),
            "hostssl all tls_role 127.0.0.1/32 scram-sha-256".into(),
            "hostnossl all tls_role 127.0.0.1/32 reject".into(),
        ],
        files: vec![
            (
                "server.crt".into(),
                pki.server_cert_pem.clone().into_bytes(),
            ),
            ("server.key".into(), pki.server_key_pem.clone().into_bytes()),
        ],
    })
    .expect("start cluster");
    let ca_path: PathBuf = cluster
        .data_dir()
        .parent()
        .expect("cluster dir")
        .join("test-ca.crt");
    std::fs::write(&ca_path, &pki.ca_pem).expect("write CA");

    let admin = cluster.admin_client("postgres").await;
    admin
        .batch_execute(
            "CREATE ROLE trust_role LOGIN REPLICATION;
             SET password_encryption = 'md5';
             CREATE ROLE md5_role LOGIN REPLICATION PASSWORD 'md5-secret';
             SET password_encryption = 'scram-sha-256';
             CREATE ROLE scram_role LOGIN REPLICATION PASSWORD 'scram-secret';
             CREATE ROLE tls_role LOGIN REPLICATION PASSWORD 'tls-secret';",
        )
        .await
        .expect("create roles");
    let ip = "127.0.0.1";

    connect_ok(
        &role_config(&cluster, ip, "trust_role", None, SslMode::Disable),
        "trust",
    )
    .await;
    connect_ok(
        &role_config(
            &cluster,
            ip,
            "md5_role",
            Some("md5-secret"),
            SslMode::Disable,
        ),
        "md5",
    )
    .await;
    connect_ok(
        &role_config(
            &cluster,
            ip,
            "scram_role",
            Some("scram-secret"),
            SslMode::Disable,
        ),
        "SCRAM-SHA-256",
    )
    .await;
    // SCRAM over TLS without verification; the server offers -PLUS, so channel binding is used.
    connect_ok(
        &role_config(
            &cluster,
            ip,
            "scram_role",
            Some("scram-secret"),
            SslMode::Require,
        ),
        "SCRAM-SHA-256-PLUS",
    )
    .await;
    connect_ok(
        &role_config(
            &cluster,
            ip,
            "md5_role",
            Some("md5-secret"),
            SslMode::Prefer,
        ),
        "md5",
    )
    .await;

    // verify-full against our CA with the certificate's name.
    let mut full = role_config(
        &cluster,
        "localhost",
        "tls_role",
        Some("tls-secret"),
        SslMode::VerifyFull,
    );
    full.ssl_root_cert = Some(ca_path.clone());
    connect_ok(&full, "SCRAM-SHA-256-PLUS").await;
    let sql = full.connect_sql().await.expect("connect_sql over TLS");
    let ssl: bool = sql
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(ssl);

    // verify-ca ignores the name; verify-full refuses it.
    let mut ca_only = role_config(
        &cluster,
        ip,
        "tls_role",
        Some("tls-secret"),
        SslMode::VerifyCa,
    );
    ca_only.ssl_root_cert = Some(ca_path.clone());
    connect_ok(&ca_only, "SCRAM-SHA-256-PLUS").await;
    let mut wrong_name = ca_only.clone();
    wrong_name.ssl_mode = SslMode::VerifyFull;
    let err = ReplicationConnection::connect(&wrong_name)
        .await
        .expect_err("name mismatch");
    assert!(matches!(err.root(), ReplError::Tls(_)), "{err}");
    assert_eq!(err.class(), ErrorClass::Permanent);

    // verify-full with the system roots does not trust our CA.
    let mut untrusted = full.clone();
    untrusted.ssl_root_cert = None;
    let err = ReplicationConnection::connect(&untrusted)
        .await
        .expect_err("unknown CA");
    assert!(matches!(err.root(), ReplError::Tls(_)), "{err}");

    // tls_role is rejected without TLS.
    let err = ReplicationConnection::connect(&role_config(
        &cluster,
        ip,
        "tls_role",
        Some("tls-secret"),
        SslMode::Disable,
    ))
    .await
    .expect_err("hostnossl reject");
    assert_eq!(err.sqlstate(), Some("28000"), "{err}");

    // Wrong passwords name the user and the method.
    for (user, method) in [("md5_role", "md5"), ("scram_role", "SCRAM-SHA-256")] {
        let err = ReplicationConnection::connect(&role_config(
            &cluster,
            ip,
            user,
            Some("wrong"),
            SslMode::Disable,
        ))
        .await
        .expect_err("wrong password");
        let text = err.to_string();
        assert!(text.contains(&format!("\"{user}\"")), "{text}");
        assert!(text.contains(&format!("({method})")), "{text}");
        assert!(text.contains("28P01"), "{text}");
        assert_eq!(err.class(), ErrorClass::Permanent);
    }
    let err = ReplicationConnection::connect(&role_config(
        &cluster,
        ip,
        "md5_role",
        None,
        SslMode::Disable,
    ))
    .await
    .expect_err("no password");
    assert!(matches!(err.root(), ReplError::AuthClient { .. }), "{err}");
}
