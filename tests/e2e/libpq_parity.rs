//! The libpq files and variables outboxd reads, against a server with a private CA:
//! `~/.pgpass` and `PGPASSFILE` (escapes, wildcards, ignored when group/world readable),
//! client certificates (`~/.postgresql/postgresql.crt`/`.key` and `PGSSLCERT`/`PGSSLKEY`)
//! for pg_hba `cert`, `~/.postgresql/root.crt` as the default root for verify-full, the
//! system trust store (here `SSL_CERT_FILE`, which the platform loader honours) when no
//! root is given, and `PGSERVICE`. Each case runs `outboxd init` (SQL and replication
//! connections) and looks at the exit code; HOME is the test's own directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use pgtest::{ClusterOptions, PgCluster};
use support::relay::run_to_end;
use support::schema;

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for localhost/127.0.0.1 and a client certificate for
/// `client_cn`, all signed by the CA: (ca.crt, server.crt, server.key, client.crt,
/// client.key) in `dir`.
fn pki(dir: &Path, client_cn: &str) {
    let p = |n: &str| dir.join(n).display().to_string();
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=outboxd test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        &p("ca.key"),
        "-out",
        &p("ca.crt"),
    ]);
    for (name, subj, ext) in [
        (
            "server",
            "/CN=localhost".to_owned(),
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ),
        (
            "client",
            format!("/CN={client_cn}"),
            "extendedKeyUsage=clientAuth",
        ),
    ] {
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &subj,
            "-keyout",
            &p(&format!("{name}.key")),
            "-out",
            &p(&format!("{name}.csr")),
        ]);
        std::fs::write(dir.join(format!("{name}.ext")), format!("{ext}\n")).unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            &p(&format!("{name}.csr")),
            "-CA",
            &p("ca.crt"),
            "-CAkey",
            &p("ca.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &p(&format!("{name}.ext")),
            "-out",
            &p(&format!("{name}.crt")),
        ]);
    }
}

fn write_mode(path: &Path, text: &[u8], mode: u32) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

struct Case {
    name: &'static str,
    env: Vec<(&'static str, String)>,
    /// Files under the case's HOME: (relative path, contents, mode).
    home_files: Vec<(&'static str, Vec<u8>, u32)>,
    exit: i32,
}

#[tokio::test(flavor = "multi_thread")]
async fn pgpass_client_certificates_root_cert_system_store_and_service() {
    let base = std::env::temp_dir().join(format!("outboxd-libpq-{}", std::process::id()));
    let pki_dir = base.join("pki");
    std::fs::create_dir_all(&pki_dir).unwrap();
    pki(&pki_dir, "libpq_cert");
    let read = |n: &str| std::fs::read(pki_dir.join(n)).unwrap();
    let cluster = PgCluster::start(ClusterOptions {
        conf: vec![
            "ssl = on".into(),
            "ssl_cert_file = 'server.crt'".into(),
            "ssl_key_file = 'server.key'".into(),
            "ssl_ca_file = 'ca.crt'".into(),
        ],
        hba: vec![
            "hostssl all libpq_cert 127.0.0.1/32 cert".into(),
            "hostssl all libpq_cert ::1/128 cert".into(),
            "host all libpq_pass 127.0.0.1/32 scram-sha-256".into(),
            "host all libpq_pass ::1/128 scram-sha-256".into(),
        ],
        files: vec![
            ("server.crt".into(), read("server.crt")),
            ("server.key".into(), read("server.key")),
            ("ca.crt".into(), read("ca.crt")),
        ],
    })
    .expect("cluster");
    let db = cluster.fresh_database("libpq").await;
    let outbox = schema::setup(&db).await;
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE ROLE libpq_cert LOGIN SUPERUSER;
             CREATE ROLE libpq_pass LOGIN SUPERUSER PASSWORD 'pa:ss\\word';
             GRANT CONNECT ON DATABASE \"{}\" TO libpq_cert, libpq_pass;",
            db.name
        ))
        .await
        .expect("roles");
    let port = cluster.port().to_string();
    let pgpass = format!(
        "# first match wins\nlocalhost:{port}:nodb:libpq_pass:wrong\n\
         127.0.0.1:{port}:*:libpq_pass:pa\\:ss\\\\word\n*:*:*:*:wrong\n"
    )
    .into_bytes();
    let svc_file = base.join("services.conf");
    std::fs::write(
        &svc_file,
        format!(
            "[shop]\nhost=127.0.0.1\nport={port}\nuser=libpq_pass\ndbname={}\n",
            db.name
        ),
    )
    .unwrap();
    let ca = read("ca.crt");
    let cases = vec![
        Case {
            name: ".pgpass supplies the password",
            env: vec![("PGUSER", "libpq_pass".into())],
            home_files: vec![(".pgpass", pgpass.clone(), 0o600)],
            exit: 0,
        },
        Case {
            name: ".pgpass readable by others is ignored",
            env: vec![("PGUSER", "libpq_pass".into())],
            home_files: vec![(".pgpass", pgpass.clone(), 0o644)],
            exit: 3,
        },
        Case {
            name: "PGPASSFILE",
            env: vec![
                ("PGUSER", "libpq_pass".into()),
                (
                    "PGPASSFILE",
                    base.join("explicit.pgpass").display().to_string(),
                ),
            ],
            home_files: vec![],
            exit: 0,
        },
        Case {
            name: "client certificate and root.crt from ~/.postgresql, verify-full",
            env: vec![
                ("PGUSER", "libpq_cert".into()),
                ("PGHOST", "localhost".into()),
                ("PGSSLMODE", "verify-full".into()),
            ],
            home_files: vec![
                (".postgresql/postgresql.crt", read("client.crt"), 0o644),
                (".postgresql/postgresql.key", read("client.key"), 0o600),
                (".postgresql/root.crt", ca, 0o644),
            ],
            exit: 0,
        },
        Case {
            name: "PGSSLCERT/PGSSLKEY, verify-ca",
            env: vec![
                ("PGUSER", "libpq_cert".into()),
                ("PGSSLMODE", "verify-ca".into()),
                (
                    "PGSSLCERT",
                    pki_dir.join("client.crt").display().to_string(),
                ),
                (
                    "PGSSLKEY",
                    base.join("client-0600.key").display().to_string(),
                ),
                (
                    "PGSSLROOTCERT",
                    pki_dir.join("ca.crt").display().to_string(),
                ),
            ],
            home_files: vec![],
            exit: 0,
        },
        Case {
            name: "no client certificate: pg_hba cert refuses",
            env: vec![
                ("PGUSER", "libpq_cert".into()),
                ("PGSSLMODE", "require".into()),
            ],
            home_files: vec![],
            exit: 3,
        },
        Case {
            name: "a private key readable by others is refused",
            env: vec![
                ("PGUSER", "libpq_cert".into()),
                ("PGSSLMODE", "require".into()),
            ],
            home_files: vec![
                (".postgresql/postgresql.crt", read("client.crt"), 0o644),
                (".postgresql/postgresql.key", read("client.key"), 0o644),
            ],
            exit: 3,
        },
        Case {
            name: "verify-full without a root: the system trust store (SSL_CERT_FILE)",
            env: vec![
                ("PGUSER", "libpq_pass".into()),
                ("PGPASSWORD", "pa:ss\\word".into()),
                ("PGHOST", "localhost".into()),
                ("PGSSLMODE", "verify-full".into()),
                (
                    "SSL_CERT_FILE",
                    pki_dir.join("ca.crt").display().to_string(),
                ),
            ],
            home_files: vec![],
            exit: 0,
        },
        Case {
            name: "verify-full: the private CA is not in the system trust store",
            env: vec![
                ("PGUSER", "libpq_pass".into()),
                ("PGPASSWORD", "pa:ss\\word".into()),
                ("PGHOST", "localhost".into()),
                ("PGSSLMODE", "verify-full".into()),
                ("SSL_CERT_FILE", "/etc/ssl/certs/ca-certificates.crt".into()),
            ],
            home_files: vec![],
            exit: 3,
        },
        Case {
            name: "PGSERVICE from PGSERVICEFILE, password from .pgpass",
            env: vec![
                ("PGSERVICE", "shop".into()),
                ("PGSERVICEFILE", svc_file.display().to_string()),
                ("PGHOST", "192.0.2.1".into()),
            ],
            home_files: vec![(".pgpass", pgpass.clone(), 0o600)],
            exit: 0,
        },
    ];
    write_mode(&base.join("explicit.pgpass"), &pgpass, 0o600);
    write_mode(&base.join("client-0600.key"), &read("client.key"), 0o600);
    for (i, case) in cases.iter().enumerate() {
        let home: PathBuf = base.join(format!("home{i}"));
        std::fs::create_dir_all(&home).unwrap();
        for (rel, text, mode) in &case.home_files {
            write_mode(&home.join(rel), text, *mode);
        }
        let mut env: Vec<(String, String)> = vec![
            ("HOME".into(), home.display().to_string()),
            ("PGHOST".into(), "127.0.0.1".into()),
            ("PGPORT".into(), port.clone()),
            ("PGDATABASE".into(), db.name.clone()),
            ("PGSSLMODE".into(), "prefer".into()),
            ("OUTBOXD_SLOT".into(), outbox.slot.clone()),
            ("OUTBOXD_PUBLICATION".into(), outbox.publication.clone()),
        ];
        for (k, v) in &case.env {
            env.retain(|(ek, _)| ek != k);
            env.push(((*k).to_owned(), v.clone()));
        }
        let (code, out) = run_to_end(&env, &["init"]);
        assert_eq!(code, case.exit, "{}: outboxd init:\n{out}", case.name);
    }
    std::fs::remove_dir_all(&base).ok();
}
