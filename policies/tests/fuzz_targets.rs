//! Fuzz targets for the policy crate's parsers: the tool catalog (`tools.toml`), REST path
//! templates, and Cedar policy text (THREATS.md, "HTTP and TLS parsing": fuzz targets for
//! config and catalog parsing).
//!
//! Catalogs and policies are written by operators, not agents, but a reload must never take
//! the proxy down, and a catalog that loads must always give a schema that Cedar accepts:
//! the schema is generated from tool names and argument schemas, so a catalog whose text
//! breaks the generated schema would be an injection into the policy layer.
//!
//! Each target is a `bolero` check: under `cargo test`/`cargo nextest` it runs a bounded
//! number of random inputs on stable Rust; `cargo bolero test <name>` on nightly runs the
//! same target under libFuzzer, coverage-guided and unbounded (docs/fuzzing.md).

use bolero::{check, TypeGenerator};
use ostiary_policies::catalog::PathTemplate;
use ostiary_policies::{Catalog, LoadError, PolicyEngine, PolicySource};

/// Random inputs per target on stable; `BOLERO_RANDOM_ITERATIONS` overrides it. Sized so the
/// whole file stays within a few seconds on a debug build.
const ITERATIONS: usize = 2_000;
/// Targets that build a Cedar schema for every accepted input are slower per input.
const CEDAR_ITERATIONS: usize = 300;
/// Bounds for structured inputs. bolero refuses (skips) a value whose lists nest deeper
/// than its depth limit (default 5, where a string in a pair in a list in a list already
/// fails), so the limit is raised; the byte budget then bounds the values' size instead.
const STRUCTURED_MAX_LEN: usize = 16 * 1024;
const STRUCTURED_MAX_DEPTH: usize = 32;

/// A catalog that parsed must give a schema Cedar parses: `LoadError::Schema` is documented
/// as "a bug in the generator, never the user's input".
fn assert_schema_parses(catalog: Catalog, text: &str) {
    if let Err(LoadError::Schema(e)) = PolicyEngine::with_catalog(&[], catalog) {
        panic!("an accepted catalog generated a schema Cedar refuses: {e}\ncatalog:\n{text}");
    }
}

#[test]
fn catalog_parse_arbitrary_text() {
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes);
            if let Ok(catalog) = Catalog::parse("tools.toml", &text, None) {
                assert_schema_parses(catalog, &text);
            }
        });
}

/// The valid alphabet of tool names (`is_tool_name`).
const TOOL_NAME_CHARS: &[char] = &['a', 'z', 'A', '0', '9', '_', '-', '.'];

/// Characters a property name is built from: identifier characters, plus those that would
/// break out of a Cedar string or comment if not escaped.
const NAME_CHARS: &[char] = &[
    'a', 'b', 'z', 'A', 'Z', '0', '9', '_', '-', '.', '"', '\\', ':', ' ', '{', '}', '*', '/', 'é',
    '\u{0}', '\n', '\r',
];

fn text_from(indices: &[u8], alphabet: &[char]) -> String {
    indices
        .iter()
        .map(|&i| alphabet[usize::from(i) % alphabet.len()])
        .collect()
}

/// An argument schema: the JSON Schema subset `args::from_json_schema` understands, plus
/// types it must refuse (`number`, `null`, unknown ones).
#[derive(Debug, Clone, TypeGenerator)]
enum SchemaSpec {
    String,
    Integer,
    Boolean,
    Number,
    Null,
    Unknown(String),
    Array(Box<SchemaSpec>),
    Object {
        properties: Properties,
        required: Vec<u8>,
    },
}

impl SchemaSpec {
    fn to_toml(&self) -> toml::Value {
        let typed = |t: &str| {
            let mut table = toml::Table::new();
            table.insert("type".into(), t.into());
            table
        };
        let table = match self {
            SchemaSpec::String => typed("string"),
            SchemaSpec::Integer => typed("integer"),
            SchemaSpec::Boolean => typed("boolean"),
            SchemaSpec::Number => typed("number"),
            SchemaSpec::Null => typed("null"),
            SchemaSpec::Unknown(t) => typed(t),
            SchemaSpec::Array(items) => {
                let mut table = typed("array");
                table.insert("items".into(), items.to_toml());
                table
            }
            SchemaSpec::Object {
                properties,
                required,
            } => {
                let mut table = typed("object");
                let names: Vec<String> = properties
                    .iter()
                    .map(|(name, _)| text_from(name, NAME_CHARS))
                    .collect();
                let props: toml::Table = names
                    .iter()
                    .zip(properties)
                    .map(|(name, (_, spec))| (name.clone(), spec.to_toml()))
                    .collect();
                table.insert("properties".into(), props.into());
                if !names.is_empty() {
                    let required: Vec<toml::Value> = required
                        .iter()
                        .map(|&i| names[usize::from(i) % names.len()].clone().into())
                        .collect();
                    table.insert("required".into(), required.into());
                }
                table
            }
        };
        table.into()
    }
}

/// An object schema's properties: each name (indices into [`NAME_CHARS`]) and schema.
type Properties = Vec<(Vec<u8>, SchemaSpec)>;

#[derive(Debug, TypeGenerator)]
enum MatchSpec {
    Rest {
        host: Vec<u8>,
        method: u8,
        path: Vec<TemplateSegment>,
    },
    Mcp {
        url: Vec<u8>,
        tool: String,
    },
}

/// One catalog entry. Each field is well-formed unless its `chaos` byte is large (1 in 16),
/// so that most generated catalogs load and reach the schema generator.
#[derive(Debug, TypeGenerator)]
struct ToolSpec {
    name: Vec<u8>,
    raw_name: (u8, String),
    tier: u8,
    matcher: MatchSpec,
    /// The top level of `args_schema` is an object: its properties and required names.
    args_schema: Option<(Properties, Vec<u8>)>,
    impact: (u8, String),
    cost: (u8, f64),
    credential: Option<String>,
    reversible: Option<bool>,
}

/// Once bolero's byte budget is spent every further byte is 0, so 0 must mean "sane".
fn chaos(selector: u8) -> bool {
    selector >= 240
}

impl ToolSpec {
    fn to_toml(&self) -> toml::Table {
        let mut tool = toml::Table::new();
        let name = match &self.raw_name {
            (c, raw) if chaos(*c) => raw.clone(),
            _ => format!("t{}", text_from(&self.name, TOOL_NAME_CHARS)),
        };
        tool.insert("name".into(), name.into());
        let tiers = [
            "read",
            "write",
            "irreversible",
            "high_impact",
            "read",
            "root",
        ];
        tool.insert(
            "tier".into(),
            tiers[usize::from(self.tier) % tiers.len()].into(),
        );
        let mut matcher = toml::Table::new();
        match &self.matcher {
            MatchSpec::Rest { host, method, path } => {
                let host_chars = ['a', 'z', '0', '-', '.'];
                let host = format!("h{}", text_from(host, &host_chars));
                matcher.insert("host".into(), host.into());
                let methods = ["GET", "POST", "DELETE", "PATCH", "GET", "POST", "", "P\"T"];
                matcher.insert(
                    "method".into(),
                    methods[usize::from(*method) % methods.len()].into(),
                );
                matcher.insert("path".into(), render_template(path).into());
            }
            MatchSpec::Mcp { url, tool: name } => {
                let path = text_from(url, LITERAL_CHARS);
                matcher.insert("mcp".into(), format!("https://m.example/{path}").into());
                matcher.insert("tool".into(), name.clone().into());
            }
        }
        tool.insert("match".into(), matcher.into());
        if let Some((properties, required)) = &self.args_schema {
            let schema = SchemaSpec::Object {
                properties: properties.clone(),
                required: required.clone(),
            };
            tool.insert("args_schema".into(), schema.to_toml());
        }
        let (c, records) = &self.impact;
        if chaos(*c) || c % 2 == 1 {
            let records = if chaos(*c) {
                records.clone()
            } else {
                "/n".into()
            };
            let mut impact = toml::Table::new();
            impact.insert("records".into(), records.into());
            tool.insert("impact".into(), impact.into());
        }
        let (c, cost) = self.cost;
        if chaos(c) || c % 2 == 1 {
            let cost = if chaos(c) { cost } else { f64::from(c) / 100.0 };
            tool.insert("cost".into(), cost.into());
        }
        if let Some(credential) = &self.credential {
            tool.insert("credential".into(), credential.clone().into());
        }
        if let Some(reversible) = self.reversible {
            tool.insert("reversible".into(), reversible.into());
        }
        tool
    }
}

#[test]
fn catalog_parse_structured_tools() {
    check!()
        .with_type::<Vec<ToolSpec>>()
        .with_iterations(CEDAR_ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|tools| {
            let mut file = toml::Table::new();
            // A few tools: one bad entry refuses the whole catalog.
            let tools = &tools[..tools.len().min(4)];
            let entries: Vec<toml::Value> = tools.iter().map(|t| t.to_toml().into()).collect();
            file.insert("tool".into(), entries.into());
            let text = toml::to_string(&file).expect("a toml::Table always serialises");
            match Catalog::parse("tools.toml", &text, None) {
                Ok(catalog) => {
                    // Every entry became one tool, reachable under its own name.
                    assert_eq!(catalog.len(), tools.len(), "{text}");
                    for tool in catalog.tools() {
                        assert!(catalog.get(tool.name()).is_some(), "{text}");
                    }
                    assert_schema_parses(catalog, &text);
                }
                Err(e) => {
                    // Errors name the file, so an operator can find the entry.
                    assert!(e.to_string().starts_with("tools.toml"), "{e}");
                }
            }
        });
}

/// Found by `catalog_parse_structured_tools`: a property whose type has no Cedar form is
/// left out of the schema with a `// args.<name> left out: <why>` comment, and the name was
/// written raw, so a newline in it ended the comment and the rest of the name became schema
/// text (here a syntax error; with care, extra declarations). Names are escaped now.
#[test]
fn catalog_property_name_with_newline_breaks_the_schema() {
    let text = r#"
[[tool]]
name = "t"
tier = "read"
match = { host = "h", method = "GET", path = "/" }
args_schema = { type = "object", properties = { "x\n}" = { type = "number" } } }
"#;
    let catalog = Catalog::parse("tools.toml", text, None).expect("the catalog is accepted");
    assert_schema_parses(catalog, text);
}

/// One segment of a path template built to be valid: a literal without `/`, `{`, `}`, `?`
/// or `#`, or a parameter (named `p<index>` so names are distinct identifiers).
#[derive(Debug, TypeGenerator)]
enum TemplateSegment {
    Literal(Vec<u8>),
    Param,
}

const LITERAL_CHARS: &[char] = &['a', 'Z', '0', '-', '.', '%', '2', 'f', ';', '=', '~', 'é'];

fn render_template(segments: &[TemplateSegment]) -> String {
    let mut text = String::new();
    let mut params = 0;
    for segment in segments {
        text.push('/');
        match segment {
            TemplateSegment::Literal(chars) => text.push_str(&text_from(chars, LITERAL_CHARS)),
            TemplateSegment::Param => {
                text.push_str(&format!("{{p{params}}}"));
                params += 1;
            }
        }
    }
    if text.is_empty() {
        text.push('/');
    }
    text
}

#[test]
fn path_template_arbitrary_text() {
    check!()
        .with_type::<(String, String)>()
        .with_iterations(ITERATIONS)
        .for_each(|(template, path)| {
            let Ok(parsed) = PathTemplate::parse(template) else {
                return;
            };
            assert!(template.starts_with('/') && !template.contains(['?', '#']));
            let params: Vec<&str> = parsed.params().collect();
            // The template's own text is a path it matches, each `{p}` capturing itself.
            let own: Vec<(String, String)> = params
                .iter()
                .map(|p| ((*p).to_owned(), format!("{{{p}}}")))
                .collect();
            assert_eq!(parsed.captures(parsed.as_str()), Some(own), "{template:?}");
            if let Some(captures) = parsed.captures(path) {
                let names: Vec<&str> = captures.iter().map(|(n, _)| n.as_str()).collect();
                assert_eq!(names, params, "{template:?} {path:?}");
                assert!(captures
                    .iter()
                    .all(|(_, v)| !v.is_empty() && !v.contains('/')));
            }
        });
}

#[test]
fn path_template_captures_round_trip() {
    check!()
        .with_type::<(Vec<TemplateSegment>, Vec<Vec<u8>>)>()
        .with_iterations(ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|(segments, values)| {
            let text = render_template(segments);
            let template = PathTemplate::parse(&text)
                .unwrap_or_else(|e| panic!("a well-formed template {text:?} is refused: {e}"));
            // Render a path from the template, filling each parameter with a non-empty
            // segment value (never containing `/`), then capture it back.
            let mut expected = Vec::new();
            let mut path = String::new();
            let mut params = template.params();
            for (i, segment) in segments.iter().enumerate() {
                path.push('/');
                match segment {
                    TemplateSegment::Literal(chars) => {
                        path.push_str(&text_from(chars, LITERAL_CHARS));
                    }
                    TemplateSegment::Param => {
                        let name = params.next().expect("one name per parameter");
                        let raw = values.get(i).map_or(&[][..], Vec::as_slice);
                        let value = format!("v{}", text_from(raw, LITERAL_CHARS));
                        path.push_str(&value);
                        expected.push((name.to_owned(), value));
                    }
                }
            }
            assert!(params.next().is_none(), "{text:?} has extra parameters");
            if path.is_empty() {
                path.push('/');
            }
            assert_eq!(
                template.captures(&path),
                Some(expected),
                "{text:?} {path:?}"
            );
        });
}

#[test]
fn cedar_policies_arbitrary_text() {
    check!()
        .with_iterations(CEDAR_ITERATIONS)
        .for_each(|bytes: &[u8]| {
            let text = String::from_utf8_lossy(bytes).into_owned();
            load_policy_text(text);
        });
}

/// Tokens of Cedar's grammar and Ostiary's schema, so random sequences reach the validator
/// instead of stopping at the first lexer error.
const CEDAR_TOKENS: &[&str] = &[
    "permit",
    "forbid",
    "(",
    ")",
    "{",
    "}",
    ",",
    ";",
    "principal",
    "action",
    "resource",
    "context",
    "when",
    "unless",
    "==",
    "!=",
    "in",
    "is",
    "like",
    "has",
    "&&",
    "||",
    "!",
    "if",
    "then",
    "else",
    ".",
    "[",
    "]",
    "<",
    "-",
    "+",
    "*",
    "0",
    "9223372036854775807",
    "\"*example.com\"",
    "\"\\u{0}\"",
    "@id(\"x\")",
    "@id(\"y\")",
    "Ostiary::Agent",
    "Ostiary::Host",
    "Ostiary::Tenant",
    "Ostiary::Action::\"http\"",
    "Ostiary::Action::\"connect\"",
    "Ostiary::Action::\"tier:read\"",
    "::\"a\"",
    "args",
    "session",
    "impact",
    "tier",
    "agent",
    "tenant",
    "ip(\"10.0.0.1\")",
    "decimal(\"1.0\")",
    "true",
];

#[test]
fn cedar_policies_token_soup() {
    check!()
        .with_type::<Vec<u8>>()
        .with_iterations(CEDAR_ITERATIONS)
        .with_max_len(STRUCTURED_MAX_LEN)
        .with_max_depth(STRUCTURED_MAX_DEPTH)
        .for_each(|tokens| {
            let text = tokens
                .iter()
                .map(|&t| CEDAR_TOKENS[usize::from(t) % CEDAR_TOKENS.len()])
                .collect::<Vec<_>>()
                .join(" ");
            load_policy_text(text);
        });
}

/// Policy text never panics the loader, and is never blamed on the schema generator.
fn load_policy_text(text: String) {
    let sources = [PolicySource {
        name: "fuzz.cedar".into(),
        text,
    }];
    match PolicyEngine::from_sources(&sources) {
        Err(LoadError::Schema(e)) => panic!("the empty catalog's schema is refused: {e}"),
        Err(_) => {}
        Ok(engine) => {
            // Every loaded policy was named and traced back to its file.
            for policy in engine.policy_set().policies() {
                let id = policy.id().to_string();
                assert_eq!(engine.origin(&id), Some("fuzz.cedar"), "{id}");
            }
        }
    }
}
