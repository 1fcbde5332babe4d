//! outboxd: relays transactional-outbox inserts from Postgres logical replication to Kafka.

mod config;

fn main() {
    match config::from_process_env() {
        Ok(s) => println!("{s:?}"),
        Err(e) => {
            eprintln!("outboxd: configuration error: {e}");
            std::process::exit(2);
        }
    }
}
