//! Grammar masks over a real 128k vocabulary, whose trie carries the index of lower-case
//! runs (`TokenTrie::build_indexed`): the grammar's own walk table and the SDK's
//! `StateTable` (the walk the json-schema, regex and tool-call plugins use) allow exactly the
//! tokens the plain trie walk allows, at every token of the fixtures' valid samples.

use dspark_guest::{Recognizer, StateTable, TokenSet};
use dspark_host::tokenizer::CanonicalTokenizer;
use dspark_plugin_grammar::compile_recognizer;
use dspark_tests::llama3_guest_table;

fn fixture(name: &str) -> String {
    let path = format!("{}/../constraints/grammar/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn masks_over_the_indexed_llama3_trie_equal_the_plain_walk() {
    let (table, tok) = llama3_guest_table();
    let (indexes, nodes, entries) = table.trie().tails_size();
    assert!(indexes > 100, "the Llama-3 trie has {indexes} indexed subtrees");
    eprintln!(
        "Llama-3 trie: {} nodes; {indexes} indexed subtrees, {nodes} remainder nodes, {entries} entries",
        table.trie().node_count()
    );
    let mut masks = 0;
    for (kind, file) in [("lark", "lang.lark"), ("lark", "json.lark"), ("lark", "sql.lark")] {
        let rec = compile_recognizer(kind, &fixture(file)).expect("the fixture compiles");
        let mut states = StateTable::default();
        let samples: serde_json::Value =
            serde_json::from_str(&fixture(&format!("{file}.samples.json"))).expect("samples JSON");
        for text in samples["valid"].as_array().expect("valid samples") {
            let text = text.as_str().expect("a sample is a string");
            let mut state = rec.start();
            for token in tok.tokenize(text.as_bytes()) {
                let mut fast = TokenSet::new(table.vocab_size());
                assert!(rec.fill_mask(&state, &table, &mut fast));
                let mut tabulated = TokenSet::new(table.vocab_size());
                states.fill(&rec, &state, &table, &mut tabulated);
                let mut plain = TokenSet::new(table.vocab_size());
                table.trie().walk(&state, &mut Vec::new(), |s, b| rec.advance(s, b), |t| plain.insert(t));
                assert_eq!(fast.words(), plain.words(), "{file}: {text:?}, grammar walk before token {token}");
                assert_eq!(tabulated.words(), plain.words(), "{file}: {text:?}, state table before token {token}");
                assert!(plain.contains(token), "{file}: {text:?} refuses its own token {token}");
                masks += 1;
                for &b in table.token_bytes(token) {
                    state = rec.advance(&state, b).expect("a valid sample's byte is accepted");
                }
            }
        }
    }
    eprintln!("{masks} masks compared");
    assert!(masks > 100);
}
