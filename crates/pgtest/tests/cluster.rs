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
