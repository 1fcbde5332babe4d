//! Connection errors say what and where: every subcommand names the target
//! (user@host:port/database) and the server's or the TLS layer's reason, and treats a
//! refused password, a missing password, a missing database and a certificate that does
//! not verify as permanent: `run`, `init` and `status` exit 3 (never retried forever),
//! `check` reports a FAIL line and exits 6.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pgtest::{ClusterOptions, PgCluster};
use support::relay::{run_to_end, Relay};
use support::schema;

/// A self-signed server certificate for localhost / 127.0.0.1, and an unrelated CA.
fn openssl_cert(dir: &Path, name: &str, subject: &str, ext: &str) -> (Vec<u8>, Vec<u8>) {
    let key = dir.join(format!("{name}.key"));
    let crt = dir.join(format!("{name}.crt"));
    let status = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args(["-subj", subject, "-addext", ext, "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl");
    assert!(status.success(), "openssl req failed");
    (
        std::fs::read(&crt).expect("cert"),
        std::fs::read(&key).expect("key"),
    )
}

struct Case {
    name: &'static str,
    user: &'static str,
    password: Option<&'static str>,
    /// None: the test database.
    dbname: Option<&'static str>,
    tls_untrusted: bool,
    /// What the message must say about the cause.
    reason: &'static [&'static str],
    /// The SQLSTATE that decided the class, named in run's last line.
    sqlstate: Option<&'static str>,
}

#[tokio::test(flavor = "multi_thread")]
async fn connection_failures_name_target_and_cause_and_are_permanent() {
    let pki = tempfile_dir();
    let (server_crt, server_key) = openssl_cert(
        &pki,
        "server",
        "/CN=localhost",
        "subjectAltName=DNS:localhost,IP:127.0.0.1",
    );
    let (other_ca, _) = openssl_cert(
        &pki,
        "other-ca",
        "/CN=other CA",
        "basicConstraints=critical,CA:TRUE",
    );
    let other_ca_path = pki.join("other-ca.crt");
    std::fs::write(&other_ca_path, &other_ca).expect("other CA");
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec![
            "ssl = on".into(),
            "ssl_cert_file = 'server.crt'".into(),
            "ssl_key_file = 'server.key'".into(),
        ],
        hba: vec![
            "host all conn_md5 127.0.0.1/32 md5".into(),
            "host all conn_scram 127.0.0.1/32 scram-sha-256".into(),
        ],
        files: vec![
            ("server.crt".into(), server_crt),
            ("server.key".into(), server_key),
        ],
    })
    .expect("cluster");
    let db = cluster.fresh_database("conn_errors").await;
    let outbox = schema::setup(&db).await;
    db.client()
        .await
        .batch_execute(&format!(
            "SET password_encryption = 'md5';
             CREATE ROLE conn_md5 LOGIN REPLICATION PASSWORD 'md5-secret';
             SET password_encryption = 'scram-sha-256';
             CREATE ROLE conn_scram LOGIN REPLICATION PASSWORD 'scram-secret';
             GRANT CONNECT ON DATABASE \"{}\" TO conn_md5, conn_scram;",
            db.name
        ))
        .await
        .expect("roles");
    let cases = [
        Case {
            name: "wrong password",
            user: "conn_scram",
            password: Some("not-the-password"),
            dbname: None,
            tls_untrusted: false,
            reason: &["password authentication failed", "28P01"],
            sqlstate: Some("28P01"),
        },
        Case {
            name: "missing database",
            user: "postgres",
            password: None,
            dbname: Some("no_such_database"),
            tls_untrusted: false,
            reason: &["no_such_database", "does not exist"],
            sqlstate: Some("3D000"),
        },
        Case {
            name: "missing password (md5)",
            user: "conn_md5",
            password: None,
            dbname: None,
            tls_untrusted: false,
            reason: &["password", "PGPASSWORD"],
            sqlstate: None,
        },
        Case {
            name: "missing password (scram)",
            user: "conn_scram",
            password: None,
            dbname: None,
            tls_untrusted: false,
            reason: &["password", "PGPASSWORD"],
            sqlstate: None,
        },
        Case {
            name: "untrusted server certificate (verify-full)",
            user: "postgres",
            password: None,
            dbname: None,
            tls_untrusted: true,
            reason: &["certificate", "PGSSLROOTCERT"],
            sqlstate: None,
        },
    ];
    for case in &cases {
        let dbname = case.dbname.unwrap_or(&db.name);
        let mut env = Relay::env_for(&db, &outbox, "127.0.0.1:9", &[]);
        env.retain(|(k, _)| !["PGUSER", "PGDATABASE", "PGSSLMODE"].contains(&k.as_str()));
        env.push(("PGUSER".into(), case.user.into()));
        env.push(("PGDATABASE".into(), dbname.into()));
        if let Some(pw) = case.password {
            env.push(("PGPASSWORD".into(), pw.into()));
        }
        if case.tls_untrusted {
            env.push(("PGSSLMODE".into(), "verify-full".into()));
            env.push(("PGSSLROOTCERT".into(), other_ca_path.display().to_string()));
        } else {
            env.push(("PGSSLMODE".into(), "disable".into()));
        }
        let target = format!("{}@127.0.0.1:{}/{dbname}", case.user, cluster.port());
        let expect_text = |what: &str, out: &str| {
            assert!(
                out.contains(&target),
                "{}: {what} names {target}:\n{out}",
                case.name
            );
            for r in case.reason {
                assert!(out.contains(r), "{}: {what} says {r:?}:\n{out}", case.name);
            }
        };

        let mut relay = Relay::start(env.clone(), &["run"]);
        let status = relay.wait_exit(Duration::from_secs(30));
        let log = relay.log_text();
        assert_eq!(status.code(), Some(3), "{}: run:\n{log}", case.name);
        expect_text("run", &log);
        let last = log
            .lines()
            .rev()
            .find(|l| l.contains("outboxd stopped"))
            .unwrap_or_else(|| panic!("{}: no final line:\n{log}", case.name));
        if let Some(code) = case.sqlstate {
            let field = format!("decided_by=SQLSTATE {code}");
            assert!(last.contains(&field), "{}: {field}:\n{last}", case.name);
        }

        for command in ["init", "status"] {
            let (code, out) = run_to_end(&env, &[command]);
            assert_eq!(code, 3, "{}: {command}:\n{out}", case.name);
            expect_text(command, &out);
        }

        let (code, out) = run_to_end(&env, &["check"]);
        assert_eq!(code, 6, "{}: check:\n{out}", case.name);
        let line = out
            .lines()
            .find(|l| l.starts_with("FAIL  postgres connection"))
            .unwrap_or_else(|| panic!("{}: no FAIL postgres connection:\n{out}", case.name));
        expect_text("check", line);
    }
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("outboxd-conn-errors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("pki dir");
    dir
}
