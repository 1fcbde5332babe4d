//! Replays the committed fuzz corpus (`fuzz/corpus/decode/`) through the fuzz target's
//! oracle on stable, so the seeds and anything the fuzzer found stay checked in the test
//! suite; the fuzzer itself runs outside CI (docs/fuzzing.md).

#[path = "../fuzz/oracle.rs"]
mod oracle;

use std::path::Path;

#[test]
fn committed_corpus_passes_the_oracle() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    // The seeds cut from the fixtures; fewer means the corpus went missing.
    assert!(
        names.len() >= 20,
        "{} inputs in {}",
        names.len(),
        dir.display()
    );
    for path in &names {
        let input = std::fs::read(path).unwrap();
        // Captured output, shown on failure: it names the input that failed.
        eprintln!("{}", path.display());
        oracle::check(&input);
    }
}
