//! Config parsing: `Config::from_toml` on any text and on mutated examples.

use super::*;

// ---------------------------------------------------------------------------------------
// Config (config/)
// ---------------------------------------------------------------------------------------

/// What `Config::validate` promises of every config it accepts.
fn check_config(text: &str) {
    let Ok(config) = Config::from_toml(text, Path::new("fuzz.toml")) else {
        return;
    };
    assert_eq!(config.state.store, "sqlite");
    assert!(!config.egress.ports.contains(&0));
    assert!(config.sessions.default_ttl <= config.sessions.max_ttl);
    assert!(config.sessions.max_cost.is_finite() && config.sessions.max_cost >= 0.0);
    assert!(config.proxy.max_header_bytes >= 1024);
    assert!(config.approvals.deadline >= config.approvals.ttl);
    assert!(!config.approvals.tick.is_zero());
    assert!(matches!(config.broker.backend.as_str(), "file" | "vault"));
    let mut names: Vec<&str> = config.credential.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), config.credential.len(), "duplicate credential");
}

#[test]
fn config_arbitrary_text() {
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| check_config(&String::from_utf8_lossy(bytes)));
}

/// Example configs to mutate: every field is reachable from them.
const EXAMPLES: &[&str] = &[
    include_str!("../../../docs/examples/ostiary.toml"),
    include_str!("../../../docs/examples/vault.toml"),
    include_str!("../../../docs/examples/local-dev.toml"),
];

/// Strings that mean something to some field (durations at the limits, rates, CIDRs,
/// enum names, addresses), so mutations get past the type checks.
const CONFIG_STRINGS: &[&str] = &[
    "",
    "0s",
    "1ns",
    "18446744073709551615s",
    "584942417356y",
    "99999999999999999999h",
    "1h",
    "100/s",
    "0/s",
    "4294967295/h",
    "4294967296/s",
    "1/fortnight",
    "sqlite",
    "redis",
    "file",
    "vault",
    "allow",
    "deny",
    "escalate",
    "limits",
    "dlp",
    "webhook",
    "args_schema",
    "calls",
    "cost",
    "127.0.0.1:0",
    "[::1]:8080",
    "10.0.0.0/8",
    "::/0",
    "http://127.0.0.1:1",
    "Bearer {secret}",
    "{secret}{secret}",
    "*.example.com",
    "*",
    "A\r\nB",
];

#[derive(Debug, TypeGenerator)]
enum Scalar {
    Known(u8),
    Str(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// A value to put into a config. Not recursive: generating deep trees costs more than
/// parsing them, and a field's type check is reached by one level of nesting.
#[derive(Debug, TypeGenerator)]
enum ConfigValue {
    Scalar(Scalar),
    Array(Vec<Scalar>),
    Table(Vec<(u8, Scalar)>),
}

impl Scalar {
    fn toml(&self) -> toml::Value {
        match self {
            Scalar::Known(i) => CONFIG_STRINGS[usize::from(*i) % CONFIG_STRINGS.len()].into(),
            Scalar::Str(s) => s.clone().into(),
            Scalar::Int(i) => (*i).into(),
            Scalar::Float(f) => (*f).into(),
            Scalar::Bool(b) => (*b).into(),
        }
    }
}

impl ConfigValue {
    fn toml(&self, keys: &[String]) -> toml::Value {
        match self {
            ConfigValue::Scalar(s) => s.toml(),
            ConfigValue::Array(items) => items.iter().map(Scalar::toml).collect::<Vec<_>>().into(),
            ConfigValue::Table(fields) => fields
                .iter()
                .map(|(k, v)| (keys[usize::from(*k) % keys.len()].clone(), v.toml()))
                .collect::<toml::Table>()
                .into(),
        }
    }
}

#[derive(Debug, TypeGenerator)]
enum Mutation {
    /// Replace the value at one key path of the example.
    Set(u16, ConfigValue),
    /// Remove one key path.
    Remove(u16),
    /// Add a key (any key seen anywhere in the examples) under one table.
    Add(u16, u16, ConfigValue),
}

/// Every key path of `table`, tables and array elements included.
fn key_paths(value: &toml::Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                path.push(k.clone());
                out.push(path.clone());
                key_paths(v, path, out);
                path.pop();
            }
        }
        toml::Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i.to_string());
                out.push(path.clone());
                key_paths(v, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The parent of `path`'s last element and that element's key.
fn parent_mut<'a>(root: &'a mut toml::Value, path: &[String]) -> Option<&'a mut toml::Value> {
    let mut at = root;
    for key in path {
        at = match at {
            toml::Value::Table(t) => t.get_mut(key)?,
            toml::Value::Array(a) => a.get_mut(key.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(at)
}

fn apply(root: &mut toml::Value, mutation: &Mutation, paths: &[Vec<String>], keys: &[String]) {
    let pick = |i: &u16| &paths[usize::from(*i) % paths.len()];
    match mutation {
        Mutation::Set(at, value) => {
            if let Some(slot) = parent_mut(root, pick(at)) {
                *slot = value.toml(keys);
            }
        }
        Mutation::Remove(at) => {
            let path = pick(at);
            let (last, parent) = path.split_last().expect("paths are non-empty");
            match parent_mut(root, parent) {
                Some(toml::Value::Table(t)) => {
                    t.remove(last);
                }
                Some(toml::Value::Array(a)) => {
                    if let Ok(i) = last.parse::<usize>() {
                        if i < a.len() {
                            a.remove(i);
                        }
                    }
                }
                _ => {}
            }
        }
        Mutation::Add(at, key, value) => {
            if let Some(toml::Value::Table(t)) = parent_mut(root, pick(at)) {
                let key = keys[usize::from(*key) % keys.len()].clone();
                t.insert(key, value.toml(keys));
            }
        }
    }
}

#[test]
fn config_mutated_examples() {
    let examples: Vec<toml::Value> = EXAMPLES
        .iter()
        .map(|text| toml::from_str(text).expect("the examples are TOML"))
        .collect();
    let paths: Vec<Vec<Vec<String>>> = examples
        .iter()
        .map(|example| {
            let mut out = Vec::new();
            key_paths(example, &mut Vec::new(), &mut out);
            out
        })
        .collect();
    let mut keys: Vec<String> = paths.iter().flatten().flatten().cloned().collect();
    // Fields the examples leave out (commented out or optional sections).
    keys.extend(
        [
            "redis",
            "smtp",
            "webhook",
            "rate_agent",
            "rate_tenant",
            "rate_burst",
            "url",
            "from",
            "token_env",
            "approle",
            "secret_id_env",
            "role_id",
        ]
        .map(String::from),
    );
    keys.retain(|k| k.parse::<usize>().is_err());
    keys.sort_unstable();
    keys.dedup();
    check!()
        .with_type::<(u8, Vec<Mutation>)>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|(example, mutations)| {
            let i = usize::from(*example) % examples.len();
            let mut doc = examples[i].clone();
            for mutation in mutations.iter().take(8) {
                apply(&mut doc, mutation, &paths[i], &keys);
            }
            // Some mutations give values TOML cannot write (a table after plain keys is
            // fine, but not every shape serialises); those are not configs anyone can load.
            if let Ok(text) = toml::to_string(&doc) {
                check_config(&text);
            }
        });
}
