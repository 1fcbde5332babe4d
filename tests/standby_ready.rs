//! With OUTBOXD_READY_STANDBY=true a standby waiting for the slot answers /readyz with
//! 200 (what the Kubernetes manifests rely on); by default it answers 503 saying it stands
//! by. The active replica is ready either way, and the standby takes over when it dies.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use pgtest::PgCluster;
use support::broker::Broker;
use support::ops;
use support::relay::{free_port, Relay};
use support::schema;

fn with_port(env: &[(String, String)], extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| k != "OUTBOXD_HTTP_ADDR")
        .cloned()
        .collect();
    env.push((
        "OUTBOXD_HTTP_ADDR".into(),
        format!("127.0.0.1:{}", free_port()),
    ));
    env.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn standby_answers_ready_only_when_opted_in() {
    let db = PgCluster::shared().fresh_database("standby_ready").await;
    let outbox = schema::setup(&db).await;
    let broker = Broker::mock();
    ops::create_topics(&broker, &outbox).await;
    let base = Relay::env_for(&db, &outbox, &broker.bootstrap(), &[]);
    let mut active = Relay::start(
        with_port(&base, &[("OUTBOXD_READY_STANDBY", "true")]),
        &["run"],
    );
    let client = db.client().await;
    ops::wait_active_pid(&client, &outbox.slot, Duration::from_secs(30)).await;
    let ready_standby = Relay::start(
        with_port(&base, &[("OUTBOXD_READY_STANDBY", "true")]),
        &["run"],
    );
    let plain_standby = Relay::start(with_port(&base, &[]), &["run"]);
    let readyz = |r: &Relay| r.http_get("/readyz");
    ops::wait_for(
        "both standbys to stand by",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            (ready_standby.log_text().contains("standing by")
                && plain_standby.log_text().contains("standing by"))
            .then_some(())
        },
    )
    .await;
    assert_eq!(readyz(&active).map(|r| r.0), Some(200));
    let (code, body) = readyz(&ready_standby).expect("readyz");
    assert_eq!(code, 200, "{body}");
    let (code, body) = readyz(&plain_standby).expect("readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("standing by"), "{body}");
    // Both standbys report not streaming, which is what the alert rules count.
    for r in [&ready_standby, &plain_standby] {
        assert_eq!(r.metric("outboxd_replication_connected"), Some(0.0));
    }

    // The active one dies: a standby takes the slot and is ready as the active one.
    active.kill();
    ops::wait_for(
        "a standby to take over and answer ready as streaming",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            [&ready_standby, &plain_standby]
                .into_iter()
                .any(|r| r.metric("outboxd_replication_connected") == Some(1.0))
                .then_some(())
        },
    )
    .await;
    let streaming = [&ready_standby, &plain_standby]
        .into_iter()
        .find(|r| r.metric("outboxd_replication_connected") == Some(1.0))
        .unwrap();
    assert_eq!(readyz(streaming).map(|r| r.0), Some(200));
}
