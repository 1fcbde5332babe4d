use pgtest::PgCluster;

#[tokio::test]
async fn shared_cluster_is_logical_and_databases_are_isolated() {
    let cluster = PgCluster::shared();
    let a = cluster.fresh_database("iso").await;
    let b = cluster.fresh_database("iso").await;
    assert_ne!(a.name, b.name);
    assert_ne!(a.slot, b.slot);
    let client = a.client().await;
    let row = client.query_one("SHOW wal_level", &[]).await.unwrap();
    assert_eq!(row.get::<_, String>(0), "logical");
    let db: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(db, a.name);
    assert_eq!(cluster.psql(&b.name, "SELECT 40 + 2").unwrap(), "42");
}

/// A matrix run tests the version it names, not the default one.
#[tokio::test]
async fn the_requested_version_runs() {
    let cluster = PgCluster::shared();
    let db = cluster.fresh_database("version").await;
    let num: u32 = cluster
        .psql(&db.name, "SHOW server_version_num")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(num / 10_000, cluster.major_version());
    if let Ok(v) = std::env::var("OUTBOXD_TEST_PG_VERSION") {
        assert_eq!(v.trim(), cluster.major_version().to_string());
    }
}
