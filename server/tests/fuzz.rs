//! Every fuzz target runs its committed seed corpus and a few seconds of mutations without a
//! crash (`scripts/fuzz.sh TARGET SECONDS` runs one for longer, on a release build).

use std::process::Command;

#[test]
fn every_target_survives_its_corpus_and_a_few_seconds_of_mutations() {
    let root = dspark_tests::repo_root();
    let list = Command::new(env!("CARGO_BIN_EXE_dspark")).args(["fuzz", "list"]).output().unwrap();
    let names: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    assert_eq!(names, ["json-schema", "lark", "gbnf", "regex", "gguf", "openai-request", "tool-calls"]);
    let crashes = tempfile::tempdir().unwrap();
    for name in &names {
        let corpus = root.join("fuzz/corpus").join(name);
        let seeds = std::fs::read_dir(&corpus).map(|d| d.count()).unwrap_or(0);
        assert!(seeds > 0, "{name} has no committed seeds in {}", corpus.display());
        let out = Command::new(env!("CARGO_BIN_EXE_dspark"))
            .args(["fuzz", name, "--seconds", "3", "--seed", "1", "--corpus"])
            .arg(&corpus)
            .arg("--crashes")
            .arg(crashes.path().join(name))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{name}:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.ends_with("no crash\n"), "{name}: {stdout}");
        let runs: u64 = stdout.split(": ").nth(1).and_then(|r| r.split(' ').next()?.parse().ok()).unwrap_or(0);
        assert!(runs as usize > seeds, "{name} ran only {runs} inputs: {stdout}");
    }
}
