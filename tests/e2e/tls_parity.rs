//! Each TLS mode against real certificates on a PostgreSQL with `ssl=on`, outboxd beside
//! psql (libpq 15) with the same settings: a certificate from another CA, a self-signed
//! one, an expired one, one with clientAuth-only key usage, one for another host, a
//! CN-only one, and the system trust store (here `SSL_CERT_FILE`, which rustls's loader
//! honours). The server's certificate is switched with `ALTER SYSTEM` and a reload.
//! Each case states libpq's outcome; where libpq 16+ differs from the installed libpq 15
//! (`sslrootcert=system`) the case asserts libpq 16's documented behaviour, and where
//! outboxd is deliberately stricter the case says so. docs/tls-and-auth.md tabulates them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use pgtest::{ClusterOptions, PgCluster};
use support::relay::run_to_end;
use support::schema;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const EC: [&str; 4] = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];

fn make_ca(dir: &Path, name: &str) {
    let mut args = vec!["req", "-x509"];
    args.extend(EC);
    args.extend([
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=outboxd tls test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    let (key, crt) = (format!("{name}.key"), format!("{name}.crt"));
    args.extend(["-keyout", &key, "-out", &crt]);
    openssl(dir, &args);
}

/// `name`.crt for `server.key`, signed by `ca` (or self-signed when `ca` is None), with
/// these extensions; `dates`: `openssl ca` start and end dates (for an expired one).
fn server_cert(
    dir: &Path,
    name: &str,
    subj: &str,
    ext: &str,
    ca: Option<&str>,
    dates: Option<(&str, &str)>,
) {
    std::fs::write(dir.join(format!("{name}.ext")), format!("{ext}\n")).unwrap();
    let csr = format!("{name}.csr");
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            "server.key",
            "-subj",
            subj,
            "-out",
            &csr,
        ],
    );
    let (crt, extfile) = (format!("{name}.crt"), format!("{name}.ext"));
    match (ca, dates) {
        (None, _) => openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-signkey",
                "server.key",
                "-days",
                "2",
                "-extfile",
                &extfile,
                "-out",
                &crt,
            ],
        ),
        (Some(ca), None) => {
            let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
            openssl(
                dir,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    &ca_crt,
                    "-CAkey",
                    &ca_key,
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    &extfile,
                    "-out",
                    &crt,
                ],
            );
        }
        (Some(ca), Some((start, end))) => {
            std::fs::create_dir_all(dir.join("newcerts")).unwrap();
            std::fs::write(dir.join("index.txt"), "").unwrap();
            std::fs::write(dir.join("serial"), "1000\n").unwrap();
            std::fs::write(
                dir.join("ca.cnf"),
                "[ca]\ndefault_ca=d\n[d]\ndatabase=index.txt\nnew_certs_dir=newcerts\nserial=serial\ndefault_md=sha256\npolicy=p\n[p]\ncommonName=supplied\n",
            )
            .unwrap();
            let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
            openssl(
                dir,
                &[
                    "ca",
                    "-batch",
                    "-config",
                    "ca.cnf",
                    "-cert",
                    &ca_crt,
                    "-keyfile",
                    &ca_key,
                    "-in",
                    &csr,
                    "-startdate",
                    start,
                    "-enddate",
                    end,
                    "-extfile",
                    &extfile,
                    "-notext",
                    "-out",
                    &crt,
                ],
            );
        }
    }
}

const LOCAL_SAN: &str = "subjectAltName=DNS:localhost,IP:127.0.0.1";

fn pki(dir: &Path) {
    make_ca(dir, "ca");
    make_ca(dir, "other-ca");
    openssl(
        dir,
        &[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-out",
            "server.key",
        ],
    );
    server_cert(dir, "good", "/CN=localhost", LOCAL_SAN, Some("ca"), None);
    server_cert(
        dir,
        "other",
        "/CN=localhost",
        LOCAL_SAN,
        Some("other-ca"),
        None,
    );
    server_cert(dir, "self", "/CN=localhost", LOCAL_SAN, None, None);
    server_cert(
        dir,
        "expired",
        "/CN=localhost",
        LOCAL_SAN,
        Some("ca"),
        Some(("20200101000000Z", "20200102000000Z")),
    );
    server_cert(
        dir,
        "clientonly",
        "/CN=localhost",
        &format!("{LOCAL_SAN}\nextendedKeyUsage=clientAuth"),
        Some("ca"),
        None,
    );
    server_cert(
        dir,
        "wronghost",
        "/CN=db.example.com",
        "subjectAltName=DNS:db.example.com",
        Some("ca"),
        None,
    );
    server_cert(
        dir,
        "cnonly",
        "/CN=localhost",
        "basicConstraints=CA:FALSE",
        Some("ca"),
        None,
    );
}

/// The server presents `cert` (a file in its data directory) from its next connection on.
async fn serve(cluster: &PgCluster, cert: &str) {
    let admin = cluster.admin_client("postgres").await;
    // One statement each: a multi-statement string is one implicit transaction, and
    // ALTER SYSTEM refuses to run in one.
    admin
        .batch_execute(&format!("ALTER SYSTEM SET ssl_cert_file = '{cert}.crt'"))
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    // A new backend forks from the postmaster, so it shows the postmaster's setting.
    for _ in 0..600 {
        let fresh = cluster.admin_client("postgres").await;
        let row = fresh.query_one("SHOW ssl_cert_file", &[]).await.unwrap();
        if row.get::<_, String>(0) == format!("{cert}.crt") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the server never reloaded ssl_cert_file = {cert}.crt");
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Accepted,
    Refused,
}
use Outcome::{Accepted, Refused};

struct Case {
    cert: &'static str,
    host: &'static str,
    /// PGSSLMODE, unset when None.
    mode: Option<&'static str>,
    /// PGSSLROOTCERT: a file of the PKI directory, `system`, or a file that does not exist.
    root: &'static str,
    outboxd: Outcome,
    libpq: Outcome,
    /// Whom `libpq` speaks for, when it is not the installed psql.
    why: &'static str,
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_modes_and_certificates_against_psql() {
    let base = std::env::temp_dir().join(format!("outboxd-tls-{}", std::process::id()));
    let pki_dir = base.join("pki");
    std::fs::create_dir_all(&pki_dir).unwrap();
    pki(&pki_dir);
    let read = |n: &str| std::fs::read(pki_dir.join(n)).unwrap();
    let mut files = vec![("server.key".to_owned(), read("server.key"))];
    for c in [
        "good",
        "other",
        "self",
        "expired",
        "clientonly",
        "wronghost",
        "cnonly",
    ] {
        files.push((format!("{c}.crt"), read(&format!("{c}.crt"))));
    }
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec![
            "ssl = on".into(),
            "ssl_cert_file = 'good.crt'".into(),
            "ssl_key_file = 'server.key'".into(),
        ],
        hba: vec![
            "host all tls_pass 127.0.0.1/32 scram-sha-256".into(),
            "host all tls_pass ::1/128 scram-sha-256".into(),
        ],
        files,
    })
    .expect("cluster");
    let db = cluster.fresh_database("tls").await;
    let outbox = schema::setup(&db).await;
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE ROLE tls_pass LOGIN SUPERUSER PASSWORD 'tls-secret';
             GRANT CONNECT ON DATABASE \"{}\" TO tls_pass;",
            db.name
        ))
        .await
        .expect("role");
    let ca = pki_dir.join("ca.crt").display().to_string();
    let missing = base.join("no-such-root.crt").display().to_string();
    let l15 = "libpq 15 (psql)";
    let l16 = "libpq 16+ (documented; libpq 15 reads `system` as a file name and refuses)";
    let stricter = "outboxd is stricter: libpq's prefer retries in plaintext after a failed verification, outboxd never drops to plaintext after a TLS failure";
    #[rustfmt::skip]
    let cases = [
        // require: no root file, no verification; with one, verify-ca.
        Case { cert: "good", host: "localhost", mode: Some("require"), root: "missing", outboxd: Accepted, libpq: Accepted, why: l15 },
        Case { cert: "self", host: "localhost", mode: Some("require"), root: "missing", outboxd: Accepted, libpq: Accepted, why: l15 },
        Case { cert: "good", host: "127.0.0.1", mode: Some("require"), root: "ca", outboxd: Accepted, libpq: Accepted, why: l15 },
        Case { cert: "other", host: "localhost", mode: Some("require"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "self", host: "localhost", mode: Some("require"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "expired", host: "localhost", mode: Some("require"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "clientonly", host: "localhost", mode: Some("require"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "wronghost", host: "localhost", mode: Some("require"), root: "ca", outboxd: Accepted, libpq: Accepted, why: l15 },
        // prefer with a root file verifies the chain too; libpq then falls back to plaintext.
        Case { cert: "other", host: "localhost", mode: Some("prefer"), root: "ca", outboxd: Refused, libpq: Accepted, why: stricter },
        // verify-ca: the chain, not the name; a root file is required.
        Case { cert: "wronghost", host: "localhost", mode: Some("verify-ca"), root: "ca", outboxd: Accepted, libpq: Accepted, why: l15 },
        Case { cert: "other", host: "localhost", mode: Some("verify-ca"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "self", host: "localhost", mode: Some("verify-ca"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "expired", host: "localhost", mode: Some("verify-ca"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "good", host: "localhost", mode: Some("verify-ca"), root: "missing", outboxd: Refused, libpq: Refused, why: l15 },
        // verify-full: chain and name (DNS and IP SANs; the CN only without a SAN).
        Case { cert: "good", host: "localhost", mode: Some("verify-full"), root: "ca", outboxd: Accepted, libpq: Accepted, why: l15 },
        Case { cert: "good", host: "127.0.0.1", mode: Some("verify-full"), root: "ca", outboxd: Accepted, libpq: Accepted, why: l15 },
        Case { cert: "wronghost", host: "localhost", mode: Some("verify-full"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "cnonly", host: "localhost", mode: Some("verify-full"), root: "ca", outboxd: Accepted, libpq: Accepted, why: l15 },
        Case { cert: "cnonly", host: "127.0.0.1", mode: Some("verify-full"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "expired", host: "localhost", mode: Some("verify-full"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        Case { cert: "other", host: "localhost", mode: Some("verify-full"), root: "ca", outboxd: Refused, libpq: Refused, why: l15 },
        // The system store (SSL_CERT_FILE holds our CA): only for verify-full.
        Case { cert: "good", host: "localhost", mode: Some("verify-full"), root: "system", outboxd: Accepted, libpq: Accepted, why: l16 },
        Case { cert: "good", host: "localhost", mode: None, root: "system", outboxd: Accepted, libpq: Accepted, why: l16 },
        Case { cert: "wronghost", host: "localhost", mode: None, root: "system", outboxd: Refused, libpq: Refused, why: l16 },
        Case { cert: "wronghost", host: "localhost", mode: Some("verify-ca"), root: "system", outboxd: Refused, libpq: Refused, why: l16 },
        Case { cert: "wronghost", host: "localhost", mode: Some("require"), root: "system", outboxd: Refused, libpq: Refused, why: l16 },
    ];
    let home = base.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut serving = "good";
    let mut wrong = Vec::new();
    for case in &cases {
        if case.cert != serving {
            serve(&cluster, case.cert).await;
            serving = case.cert;
        }
        let root = match case.root {
            "ca" => ca.clone(),
            "missing" => missing.clone(),
            other => other.to_owned(),
        };
        let mut env: Vec<(String, String)> = vec![
            ("HOME".into(), home.display().to_string()),
            ("PGHOST".into(), case.host.into()),
            ("PGPORT".into(), cluster.port().to_string()),
            ("PGUSER".into(), "tls_pass".into()),
            ("PGPASSWORD".into(), "tls-secret".into()),
            ("PGDATABASE".into(), db.name.clone()),
            ("PGSSLROOTCERT".into(), root),
            ("SSL_CERT_FILE".into(), ca.clone()),
            ("OUTBOXD_SLOT".into(), outbox.slot.clone()),
            ("OUTBOXD_PUBLICATION".into(), outbox.publication.clone()),
        ];
        if let Some(mode) = case.mode {
            env.push(("PGSSLMODE".into(), mode.into()));
        }
        let (code, out) = run_to_end(&env, &["init"]);
        let outboxd = match code {
            0 => Accepted,
            2 | 3 => Refused,
            other => panic!("{}: outboxd init exited {other}:\n{out}", describe(case)),
        };
        let libpq = if case.why == l16 {
            case.libpq
        } else {
            let out = Command::new("psql")
                .args(["-X", "-w", "-tA", "-c", "SELECT 1"])
                .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .env("PGGSSENCMODE", "disable")
                .env_remove("PGSERVICE")
                .output()
                .expect("psql");
            if out.status.success() {
                Accepted
            } else {
                Refused
            }
        };
        if (outboxd, libpq) != (case.outboxd, case.libpq) {
            wrong.push(format!(
                "{}: outboxd {outboxd:?} (expected {:?}), libpq {libpq:?} (expected {:?}, {}):\n{out}",
                describe(case),
                case.outboxd,
                case.libpq,
                case.why
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));

    // `outboxd check`: a mode below verify-full and a password the server could ask for
    // in cleartext are warnings (the check still passes); verify-full with
    // PGREQUIREAUTH=scram-sha-256 draws neither.
    serve(&cluster, "good").await;
    let broker = support::broker::Broker::default_for_tests();
    // check fails without the dead-letter topic the relay would need.
    broker
        .create_topics(&[&outbox.dead_letter_topic()], 1)
        .await;
    let check = |mode: &str, require_auth: Option<&str>| {
        let mut env = vec![
            ("HOME".to_owned(), home.display().to_string()),
            ("PGHOST".into(), "localhost".into()),
            ("PGPORT".into(), cluster.port().to_string()),
            ("PGUSER".into(), "tls_pass".into()),
            ("PGPASSWORD".into(), "tls-secret".into()),
            ("PGDATABASE".into(), db.name.clone()),
            ("PGSSLMODE".into(), mode.to_owned()),
            ("PGSSLROOTCERT".into(), ca.clone()),
            ("OUTBOXD_SLOT".into(), outbox.slot.clone()),
            ("OUTBOXD_PUBLICATION".into(), outbox.publication.clone()),
            ("OUTBOXD_KAFKA_BOOTSTRAP_SERVERS".into(), broker.bootstrap()),
            (
                "OUTBOXD_DEAD_LETTER_TOPIC".into(),
                outbox.dead_letter_topic(),
            ),
        ];
        if let Some(r) = require_auth {
            env.push(("PGREQUIREAUTH".into(), r.to_owned()));
        }
        let (code, out) = run_to_end(&env, &["check"]);
        assert_eq!(code, 0, "warnings do not fail the check:\n{out}");
        let warned = |what: &str| {
            out.lines()
                .any(|l| l.starts_with(&format!("warn  {what}:")))
        };
        (
            warned("postgres connection security"),
            warned("postgres password"),
            out,
        )
    };
    for mode in ["require", "verify-ca", "prefer"] {
        let (tls, password, out) = check(mode, None);
        assert!(tls && password, "sslmode={mode}:\n{out}");
    }
    let (tls, password, out) = check("verify-full", Some("scram-sha-256"));
    assert!(!tls && !password, "{out}");
    std::fs::remove_dir_all(&base).ok();
}

fn describe(case: &Case) -> String {
    format!(
        "certificate {} host {} sslmode={} sslrootcert={}",
        case.cert,
        case.host,
        case.mode.unwrap_or("(unset)"),
        case.root
    )
}
