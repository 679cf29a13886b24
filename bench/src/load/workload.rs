//! The benchmark's workloads: prompts generated from a seed, with the records they contain
//! known, the fixed schema, and the scoring of an answer.
//!
//! - `orders`: the reference test of the published DSpark figure. A text describes N orders
//!   (order id, product, quantity, unit price, total price, status) in varied sentences; the
//!   model extracts them into `{"orders": [...]}` under a fixed schema. The order id has the
//!   pattern the text uses (`ORD-` and four digits), as a schema written for this data would.
//!   The array holds exactly N records (`minItems` = `maxItems` = N): the instruction says how
//!   many the text holds, and so does a schema written for the request. Without the bound
//!   (`dspark bench --any-count`) small models keep inventing records until `max_tokens` cuts
//!   the JSON (SmolLM2-135M: a quarter of the answers), which measures the model's stamina,
//!   not the server. Free-text fields have a `maxLength` of 64 (the longest true value has
//!   27 characters) for the same reason: a small model caught in a loop inside a string
//!   (`"MECHANICAL_KEYWORD_KEYWORD_..."`) would otherwise run to `max_tokens`.
//! - `users`: the same shape with N users (id, name, age, email).
//! - `text`: the `orders` prompts with no constraint (the model's unconstrained speed on the
//!   same inputs).
//!
//! Prompt `i` of seed `s` is the same on every run and every target, so two targets see the
//! same requests and greedy outputs can be compared byte for byte.

use serde_json::{Value, json};

/// Which workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Extract N order records into a fixed schema.
    Orders,
    /// Extract N user records into a fixed schema.
    Users,
    /// The `orders` prompts, unconstrained.
    Text,
}

/// One generated request: its messages, the records it contains and the schema it is
/// constrained by (none for `text`).
pub struct Prompt {
    /// The chat messages.
    pub messages: Value,
    /// The records the text contains, as the schema's items.
    pub truth: Vec<Value>,
    /// The schema answers must validate against (also used for scoring `text` answers).
    pub schema: Value,
    /// Whether the request carries the schema as a constraint.
    pub constrained: bool,
    /// The array key in the answer (`orders` or `users`).
    pub key: &'static str,
}

use crate::rng::SplitMix64 as Rng;

const PRODUCTS: &[&str] = &[
    "Wireless Mouse",
    "USB-C Cable",
    "Mechanical Keyboard",
    "Laptop Stand",
    "Noise Cancelling Headphones",
    "Webcam",
    "Desk Lamp",
    "External SSD",
    "Monitor Arm",
    "Bluetooth Speaker",
    "Phone Charger",
    "Ergonomic Chair",
    "Graphics Tablet",
    "HDMI Adapter",
    "Portable Projector",
];

/// The statuses of the `orders` schema's enum.
pub const STATUSES: &[&str] = &["pending", "processing", "shipped", "delivered", "cancelled"];

const FIRST: &[&str] =
    &["Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena"];
const LAST: &[&str] =
    &["Moreno", "Novak", "Okafor", "Petrov", "Quinn", "Rossi", "Sato", "Tanaka", "Ueda", "Varga", "Weber", "Young"];

/// The fixed schema of a workload; `count`, when given, is the exact number of records.
pub fn schema(workload: Workload, count: Option<usize>) -> Value {
    let mut schema = match workload {
        Workload::Orders | Workload::Text => json!({
            "type": "object",
            "properties": {"orders": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string", "pattern": "^ORD-[0-9]{4}$"},
                    "product_name": {"type": "string", "maxLength": 64},
                    "quantity": {"type": "integer"},
                    "unit_price": {"type": "number"},
                    "total_price": {"type": "number"},
                    "status": {"type": "string", "enum": STATUSES}
                },
                "required": ["order_id", "product_name", "quantity", "unit_price", "total_price", "status"],
                "additionalProperties": false
            }}},
            "required": ["orders"],
            "additionalProperties": false
        }),
        Workload::Users => json!({
            "type": "object",
            "properties": {"users": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer"},
                    "name": {"type": "string", "maxLength": 64},
                    "age": {"type": "integer"},
                    "email": {"type": "string", "maxLength": 64}
                },
                "required": ["id", "name", "age", "email"],
                "additionalProperties": false
            }}},
            "required": ["users"],
            "additionalProperties": false
        }),
    };
    if let Some(n) = count {
        let key = if workload == Workload::Users { "users" } else { "orders" };
        let array = &mut schema["properties"][key];
        array["minItems"] = json!(n);
        array["maxItems"] = json!(n);
    }
    schema
}

/// Prompt `index` of `seed` with `records` records; `bound_count` puts their number in the
/// schema.
pub fn prompt(workload: Workload, seed: u64, index: usize, records: usize, bound_count: bool) -> Prompt {
    let mut rng = Rng(seed ^ (index as u64).wrapping_mul(0xA24B_AED4_963E_E407));
    let (key, lines, truth) = match workload {
        Workload::Orders | Workload::Text => orders(&mut rng, records),
        Workload::Users => users(&mut rng, records),
    };
    let fields = match workload {
        Workload::Users => "id, name, age, email",
        _ => {
            "order_id, product_name, quantity, unit_price, total_price, status (one of pending, processing, shipped, delivered, cancelled)"
        }
    };
    let instruction = format!(
        "Extract all {records} {key} from the text below. Answer with JSON only: an object with the key \"{key}\" \
         holding one object per record, in the order of the text, with the fields {fields}. Prices are numbers \
         without a currency sign.\n\nText:\n{}",
        lines.join("\n")
    );
    Prompt {
        messages: json!([{"role": "user", "content": instruction}]),
        truth,
        schema: schema(workload, bound_count.then_some(records)),
        constrained: workload != Workload::Text,
        key,
    }
}

fn cents(c: u64) -> String {
    format!("{}.{:02}", c / 100, c % 100)
}

fn orders(rng: &mut Rng, n: usize) -> (&'static str, Vec<String>, Vec<Value>) {
    let mut lines = Vec::new();
    let mut truth = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for _ in 0..n {
        let id = loop {
            let id = format!("ORD-{:04}", 1000 + rng.below(9000));
            if ids.insert(id.clone()) {
                break id;
            }
        };
        let product = rng.pick(PRODUCTS);
        let quantity = 1 + rng.below(9);
        let unit = 199 + rng.below(20_000);
        let total = unit * quantity;
        let status = rng.pick(STATUSES);
        let (u, t) = (cents(unit), cents(total));
        lines.push(match rng.below(3) {
            0 => {
                format!("Order {id} was placed for {quantity} x {product} at ${u} each, ${t} in total; it is {status}.")
            }
            1 => format!("{id}: {quantity} units of {product}, unit price ${u}, total ${t}, status {status}."),
            _ => format!(
                "The customer bought {quantity} {product} (order {id}) for ${u} apiece, paying ${t}. Status: {status}."
            ),
        });
        truth.push(json!({
            "order_id": id,
            "product_name": product,
            "quantity": quantity,
            "unit_price": unit as f64 / 100.0,
            "total_price": total as f64 / 100.0,
            "status": status,
        }));
    }
    ("orders", lines, truth)
}

fn users(rng: &mut Rng, n: usize) -> (&'static str, Vec<String>, Vec<Value>) {
    let mut lines = Vec::new();
    let mut truth = Vec::new();
    for i in 0..n {
        let id = 100 + i as u64 * 7 + rng.below(7);
        let (first, last) = (rng.pick(FIRST), rng.pick(LAST));
        let age = 18 + rng.below(60);
        let email = format!("{}.{}@example.com", first.to_lowercase(), last.to_lowercase());
        lines.push(match rng.below(2) {
            0 => format!("User #{id} is {first} {last}, {age} years old, reachable at {email}."),
            _ => format!("{first} {last} (id {id}, age {age}) uses the address {email}."),
        });
        truth.push(json!({"id": id, "name": format!("{first} {last}"), "age": age, "email": email}));
    }
    ("users", lines, truth)
}

/// How an answer scores.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Score {
    /// The answer parses as JSON.
    pub valid_json: bool,
    /// It validates against the workload's schema.
    pub schema_valid: bool,
    /// Records of the truth found exactly (every field equal) in the answer.
    pub records_right: usize,
    /// Records in the truth.
    pub records: usize,
}

/// Scores an answer against its prompt.
pub fn score(prompt: &Prompt, validator: &jsonschema::Validator, answer: &str) -> Score {
    let mut s = Score { records: prompt.truth.len(), ..Score::default() };
    let Ok(value) = serde_json::from_str::<Value>(answer.trim()) else { return s };
    s.valid_json = true;
    s.schema_valid = validator.is_valid(&value);
    if let Some(items) = value.get(prompt.key).and_then(Value::as_array) {
        s.records_right = prompt.truth.iter().filter(|t| items.iter().any(|item| same(t, item))).count();
    }
    s
}

/// Field-by-field equality, numbers compared as numbers (`12.5` equals `12.50`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() < 1e-9,
            _ => false,
        },
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_are_reproducible_and_differ_per_index() {
        let a = prompt(Workload::Orders, 7, 3, 5, true);
        let b = prompt(Workload::Orders, 7, 3, 5, true);
        let c = prompt(Workload::Orders, 7, 4, 5, true);
        assert_eq!(a.messages, b.messages);
        assert_ne!(a.messages, c.messages);
        assert_eq!(a.truth.len(), 5);
        let validator = jsonschema::validator_for(&a.schema).unwrap();
        // The truth itself is a perfect, schema-valid answer.
        let perfect = json!({"orders": a.truth}).to_string();
        assert_eq!(
            score(&a, &validator, &perfect),
            Score { valid_json: true, schema_valid: true, records_right: 5, records: 5 }
        );
        // Every record appears in the text with its id, product and prices.
        let text = a.messages[0]["content"].as_str().unwrap();
        for r in &a.truth {
            assert!(text.contains(r["order_id"].as_str().unwrap()));
            assert!(text.contains(r["product_name"].as_str().unwrap()));
        }
    }

    #[test]
    fn scoring_counts_exact_records_only() {
        let p = prompt(Workload::Users, 1, 0, 3, true);
        let validator = jsonschema::validator_for(&p.schema).unwrap();
        let mut answer = json!({"users": p.truth.clone()});
        answer["users"][1]["age"] = json!(999);
        let s = score(&p, &validator, &answer.to_string());
        assert_eq!((s.valid_json, s.schema_valid, s.records_right), (true, true, 2));
        assert!(!score(&p, &validator, "{\"users\": [").valid_json);
        let s = score(&p, &validator, "{\"people\": []}");
        assert_eq!((s.valid_json, s.schema_valid, s.records_right), (true, false, 0));
    }

    #[test]
    fn the_schema_holds_exactly_the_records_of_the_text_unless_told_otherwise() {
        for workload in [Workload::Orders, Workload::Users] {
            let p = prompt(workload, 3, 1, 4, true);
            let validator = jsonschema::validator_for(&p.schema).unwrap();
            let mut records = p.truth.clone();
            assert!(validator.is_valid(&json!({p.key: records})));
            records.push(p.truth[0].clone());
            assert!(!validator.is_valid(&json!({p.key: records})), "{workload:?}: one record too many");
            assert!(!validator.is_valid(&json!({p.key: p.truth[..3]})), "{workload:?}: one record too few");
            let open = prompt(workload, 3, 1, 4, false);
            let validator = jsonschema::validator_for(&open.schema).unwrap();
            assert!(validator.is_valid(&json!({p.key: records})));
            assert!(validator.is_valid(&json!({p.key: p.truth[..3]})));
        }
    }
}
