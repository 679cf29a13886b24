//! No client can disable a plugin: a hundred hostile constraints in a row (deep nesting,
//! catastrophic patterns, 300,000 nested parentheses in a Lark rule) each fail their own
//! request with a request error, and every plugin keeps serving normal requests afterwards.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dspark_host::constraint::{BuildError, ConstraintMode, ConstraintRequest, ConstraintRuntime};
use dspark_host::engine::{BackendChoice, load};
use dspark_host::plugin::PluginStatus;
use dspark_tests::{Fixture, builtin_plugin, smollm2};

fn nested(open: &str, inner: &str, close: &str, depth: usize) -> String {
    format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
}

/// The `i`th hostile constraint: five shapes, each a little different every time, so that no
/// two are the same constraint.
fn hostile(i: usize) -> ConstraintRequest {
    match i % 5 {
        0 => ConstraintRequest::new("lark", format!("start: {}", nested("(", "\"a\"", ")", 300_000 + i))),
        1 => ConstraintRequest::new("gbnf", format!("root ::= {}", nested("(", "\"a\"", ")", 100_000 + i))),
        2 => ConstraintRequest::new(
            "json-schema",
            nested(r#"{"type":"array","items":"#, &format!(r#"{{"const":{i}}}"#), "}", 20_000 + i),
        ),
        3 => ConstraintRequest::new(
            "json-schema",
            format!(r#"{{"type":"string","pattern":"^((a|aa)+{{{}}}){{1000}}$"}}"#, 100 + i),
        ),
        _ => ConstraintRequest::new("regex", format!("((x+x+)+y{{{}}}){{1000}}", 1000 + i)),
    }
}

#[test]
fn a_hundred_hostile_constraints_leave_every_plugin_serving() {
    let plugins = ["json-schema", "grammar", "regex"];
    let fixture = Fixture::new(&plugins.map(builtin_plugin), |c| c.compile_deadline = Duration::from_secs(2));
    let (model, tokenizer) = load(BackendChoice::Cpu, &smollm2()).unwrap();
    let runtime = ConstraintRuntime::new(Arc::new(tokenizer), model.config().vocab_size, ConstraintMode::DSpark);

    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..100 {
        let request = hostile(i);
        let outcome = match runtime.build(&fixture.registry, &request) {
            Ok(_) => "compiled".to_string(),
            Err(e @ (BuildError::Invalid { .. } | BuildError::TooCostly { .. })) => {
                let variant = if matches!(e, BuildError::Invalid { .. }) { "invalid" } else { "too costly" };
                format!("{} {variant}", request.kind)
            }
            Err(e) => panic!("hostile constraint #{i} ({}) was not the request's error: {e}", request.kind),
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    eprintln!("outcomes: {outcomes:?}");

    for name in plugins {
        let plugin = fixture.registry.get(name).unwrap();
        assert_eq!((plugin.status(), plugin.strikes()), (PluginStatus::Ready, 0), "{name}");
    }
    for request in [
        ConstraintRequest::new("json-schema", r#"{"type":"object","properties":{"a":{"type":"integer"}}}"#),
        ConstraintRequest::new("lark", r#"start: "yes" | "no""#),
        ConstraintRequest::new("gbnf", r#"root ::= "yes" | "no""#),
        ConstraintRequest::new("regex", "(yes|no)"),
    ] {
        let built = runtime.build(&fixture.registry, &request);
        assert!(built.is_ok(), "{} still serves: {:?}", request.kind, built.err());
    }
}
