//! The tool catalog: `tools.toml` in the policy directory (docs/design.md §4).
//!
//! Each `[[tool]]` names a tool, its risk tier, how the proxy recognises a call to it (a REST
//! route or an MCP endpoint and tool name), the JSON Schema of its arguments, how to read its
//! impact, its cost and the credential it uses. The catalog is what turns "a POST to
//! api.github.com" into `Action::"tool:github.create_issue"`, so every entry is checked here,
//! at load time, with errors naming the file, the tool and the line: a catalog that loads is
//! one the schema generator and the proxy can use without further checks.
//!
//! A missing `tools.toml` is an empty catalog: every request then stays `Action::"http"`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use crate::args::{self, Omitted, RecordType};
use crate::labels::{check_labels, HostLabels, HostProblem, LabelProblem, RawHost};
use crate::undo::UndoSpec;
pub use impact::ImpactError;
pub use path_template::PathTemplate;

mod impact;
mod path_template;

/// File name of the catalog inside the policy directory.
pub const CATALOG_FILE: &str = "tools.toml";

/// Why a catalog could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or not the shape of a catalog (unknown field, bad tier, wrong type).
    #[error("{file}{}{}: {message}", line_suffix(.line), tool_suffix(.tool))]
    Parse {
        file: String,
        /// 1-based line, when toml points at one.
        line: Option<usize>,
        /// The tool whose entry holds the error, when it has a readable `name`.
        tool: Option<String>,
        message: String,
    },
    /// An entry parsed but is not usable.
    #[error("{file}:{line}: tool {tool:?}: {problem}")]
    Tool {
        file: String,
        /// 1-based line of the entry's `name`.
        line: usize,
        tool: String,
        problem: ToolProblem,
    },
    /// A `[[host]]` entry parsed but is not usable.
    #[error("{file}:{line}: host {host:?}: {problem}")]
    Host {
        file: String,
        /// 1-based line of the entry's `name`.
        line: usize,
        host: String,
        problem: HostProblem,
    },
}

/// What is wrong with one catalog entry.
#[derive(Debug, thiserror::Error)]
pub enum ToolProblem {
    #[error("the name is already used by the tool at line {first_line}")]
    DuplicateName { first_line: usize },
    #[error(
        "the name must be 1-128 ASCII letters, digits, `_`, `-` or `.`, starting with a letter \
         (it becomes the Cedar action id \"tool:<name>\")"
    )]
    InvalidName,
    #[error("match: {0}")]
    Match(String),
    #[error("match.path {path:?}: {reason}")]
    PathTemplate { path: String, reason: String },
    #[error("match.mcp {url:?} is not an http(s) URL: {reason}")]
    Endpoint { url: String, reason: String },
    #[error("impact.records {pointer:?} is not a JSON pointer: {reason}")]
    Pointer { pointer: String, reason: String },
    #[error("cost must be a finite number between 0 and 1e12, got {0}")]
    Cost(f64),
    #[error("args_schema: reading {}: {source}", path.display())]
    SchemaRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("args_schema: {0}")]
    Schema(String),
    #[error("labels: {0}")]
    Labels(#[from] LabelProblem),
    #[error("undo: {0}")]
    Undo(String),
    #[error("the name is the undo action of the tool at line {tool_line} (\"tool:<name>.undo\")")]
    UndoName { tool_line: usize },
}

fn line_suffix(line: &Option<usize>) -> String {
    line.map(|l| format!(":{l}")).unwrap_or_default()
}

fn tool_suffix(tool: &Option<String>) -> String {
    tool.as_ref()
        .map(|t| format!(": tool {t:?}"))
        .unwrap_or_default()
}

/// The risk tier of a tool; each is a Cedar action group `Action::"tier:<tier>"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    Read,
    Write,
    Irreversible,
    HighImpact,
}

impl Tier {
    /// Every tier, in escalating order.
    pub const ALL: [Tier; 4] = [
        Tier::Read,
        Tier::Write,
        Tier::Irreversible,
        Tier::HighImpact,
    ];

    /// The name used in `tools.toml`, in the `Tool` entity's `tier` and in `tier:<name>`.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Read => "read",
            Tier::Write => "write",
            Tier::Irreversible => "irreversible",
            Tier::HighImpact => "high_impact",
        }
    }
}

/// How a call to a tool is recognised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolMatch {
    /// A REST route: the host, the method (uppercase) and a path template.
    Rest {
        host: String,
        method: String,
        path: PathTemplate,
    },
    /// A `tools/call` of `tool` on the MCP endpoint `endpoint` (Streamable HTTP).
    Mcp { endpoint: url::Url, tool: String },
}

/// One checked catalog entry.
#[derive(Debug, Clone)]
pub struct Tool {
    name: String,
    line: usize,
    tier: Tier,
    matcher: ToolMatch,
    args_schema: Option<Value>,
    /// `args_schema` as JSON text, written once at load: what a compiled validator is
    /// found by, so that a call does not serialise the schema to look its validator up.
    args_schema_text: Option<String>,
    pub(crate) args: RecordType,
    omitted: Vec<Omitted>,
    impact_records: Option<String>,
    cost: Option<f64>,
    credential: Option<String>,
    reversible: bool,
    labels: Vec<String>,
    undo: Option<UndoSpec>,
}

impl Tool {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// 1-based line of the entry's `name` in the catalog file.
    pub fn line(&self) -> usize {
        self.line
    }

    pub fn tier(&self) -> Tier {
        self.tier
    }

    pub fn matcher(&self) -> &ToolMatch {
        &self.matcher
    }

    /// The JSON Schema of the arguments (read from its file if given as a path).
    pub fn args_schema(&self) -> Option<&Value> {
        self.args_schema.as_ref()
    }

    /// `args_schema` as JSON text (`Value`'s `Display`), the same for equal schemas.
    pub fn args_schema_text(&self) -> Option<&str> {
        self.args_schema_text.as_deref()
    }

    /// Schema locations left out of `context.args` because Cedar has no type for them.
    pub fn omitted_args(&self) -> &[Omitted] {
        &self.omitted
    }

    /// Check one call's arguments against the type of `context.args` (the conversion the
    /// engine makes when it decides, where a mismatch is a deny like any evaluation error).
    /// `Err` names the first mismatch by its location and the kinds involved, never by the
    /// value, so the proxy can answer it as a failed check (422) and the audit can keep it.
    pub fn check_args(&self, args: &Value) -> Result<(), String> {
        self.args.value(args, "args").map(drop)
    }

    /// A key of one call's arguments spelled in another case than the property the tool's
    /// `args_schema` declares there ([`args::misspelled`]); `None` without a schema, whose
    /// arguments no policy or check reads.
    pub fn misspelled_arg(&self, args: &Value) -> Option<args::Misspelled> {
        args::misspelled(self.args_schema.as_ref()?, args)
    }

    /// The `impact.records` JSON pointer into the arguments.
    pub fn impact_pointer(&self) -> Option<&str> {
        self.impact_records.as_deref()
    }

    /// `impact.records` for these arguments (docs/policies.md, "Tools, tiers and
    /// escalation"): what the pointer finds, read as a count of records.
    /// - nothing counted, `Ok(0)`: the tool has no extractor, or there is nothing at the
    ///   pointer (the argument is absent, or JSON `null`);
    /// - an array: its length;
    /// - a number: its value, when it is a whole number (`1000`, `1000.0`, `1e3`, as
    ///   `args` reads an `integer`: [`args::integer`]) and not negative;
    /// - a string of ASCII digits: its value (query and path parameters arrive as strings).
    ///
    /// Anything else — a negative, fractional or out-of-range number, any other string, an
    /// object, a boolean — is an [`ImpactError`]: a policy bounding the count would
    /// otherwise read 0 and let the largest call through. The caller refuses the call.
    pub fn impact_records(&self, args: &Value) -> Result<i64, ImpactError> {
        match self.impact_records.as_deref() {
            None => Ok(0),
            Some(pointer) => impact::count(pointer, args),
        }
    }

    /// Cost of one call, as written (`cost = 0.001`).
    pub fn cost(&self) -> Option<f64> {
        self.cost
    }

    /// Cost of one call in micro-units (see [`crate::schema`]: Cedar has no floats), 0 if
    /// none is given.
    pub fn cost_micros(&self) -> i64 {
        self.cost.map(cost_to_micros).unwrap_or(0)
    }

    pub fn credential(&self) -> Option<&str> {
        self.credential.as_deref()
    }

    /// Given, or by default false for irreversible and high-impact tools, true otherwise.
    pub fn reversible(&self) -> bool {
        self.reversible
    }

    /// The request that reverses a call (`undo`), if the tool declares one.
    pub fn undo(&self) -> Option<&UndoSpec> {
        self.undo.as_ref()
    }

    /// The labels a session takes on once policy allowed it a call of this tool
    /// ([`crate::labels`]); most tools have none.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The host serving the tool (the REST host, or the MCP endpoint's host): the `Tool`
    /// entity's `server`.
    pub fn server(&self) -> &str {
        match &self.matcher {
            ToolMatch::Rest { host, .. } => host,
            ToolMatch::Mcp { endpoint, .. } => endpoint.host_str().unwrap_or_default(),
        }
    }
}

/// Money to micro-units: `0.001` → `1000`. Rounded to the nearest micro-unit; the catalog
/// bounds costs to 1e12, so the product fits an `i64`.
pub fn cost_to_micros(cost: f64) -> i64 {
    // The catalog bounds costs to 1e12, so the cast never saturates there (`as` saturates
    // for any other input rather than wrapping).
    (cost * 1_000_000.0).round() as i64
}

/// The checked catalog.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    tools: Vec<Tool>,
    by_name: HashMap<String, usize>,
    /// The text it was parsed from, by file name (`None`: no catalog file).
    source: Option<(String, String)>,
    /// The argument schema files its tools name, by the path as written, as read: with
    /// `source`, every byte the catalog came from (a policy set's version hashes them).
    schema_files: Vec<(String, String)>,
    /// The `[[host]]` entries' labels.
    hosts: HostLabels,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    tool: Vec<RawTool>,
    #[serde(default)]
    host: Vec<RawHost>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: Spanned<String>,
    tier: Tier,
    #[serde(rename = "match")]
    matcher: RawMatch,
    args_schema: Option<Value>,
    impact: Option<RawImpact>,
    cost: Option<f64>,
    credential: Option<String>,
    reversible: Option<bool>,
    #[serde(default)]
    labels: Vec<String>,
    undo: Option<crate::undo::RawUndo>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    host: Option<String>,
    method: Option<String>,
    path: Option<String>,
    mcp: Option<String>,
    tool: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImpact {
    records: Option<String>,
}

/// Only to name the tool an error is in: each entry, whatever it holds.
#[derive(Debug, Deserialize)]
struct LenientFile {
    #[serde(default)]
    tool: Vec<toml::Table>,
}

impl Catalog {
    /// Load `<dir>/tools.toml`; a missing file is an empty catalog. `args_schema` paths are
    /// relative to `dir`.
    pub fn load_dir(dir: &Path) -> Result<Self, CatalogError> {
        let path = dir.join(CATALOG_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(CATALOG_FILE, &text, Some(dir)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(CatalogError::Read { path, source }),
        }
    }

    /// Parse catalog text. `file` names it in errors; `dir` resolves `args_schema` paths
    /// (without one, a path is an error).
    pub fn parse(file: &str, text: &str, dir: Option<&Path>) -> Result<Self, CatalogError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let offset = e.span().map(|span| span.start);
            CatalogError::Parse {
                file: file.to_owned(),
                line: offset.map(|o| line_of(text, o)),
                tool: offset.and_then(|o| tool_at(text, o)),
                message: e.message().trim_end().to_owned(),
            }
        })?;
        let mut catalog = Self {
            source: Some((file.to_owned(), text.to_owned())),
            ..Self::default()
        };
        for raw_tool in raw.tool {
            let line = line_of(text, raw_tool.name.span().start);
            let name = raw_tool.name.get_ref().clone();
            let error = |problem| CatalogError::Tool {
                file: file.to_owned(),
                line,
                tool: name.clone(),
                problem,
            };
            if let Some(&first) = catalog.by_name.get(&name) {
                return Err(error(ToolProblem::DuplicateName {
                    first_line: catalog.tools[first].line,
                }));
            }
            let tool = check_tool(raw_tool, line, dir, &mut catalog.schema_files).map_err(error)?;
            catalog
                .by_name
                .insert(tool.name.clone(), catalog.tools.len());
            catalog.tools.push(tool);
        }
        catalog.check_undo_names(file)?;
        for raw_host in raw.host {
            let line = line_of(text, raw_host.name.span().start);
            let host = raw_host.name.get_ref().clone();
            catalog
                .hosts
                .add(raw_host, line)
                .map_err(|problem| CatalogError::Host {
                    file: file.to_owned(),
                    line,
                    host,
                    problem,
                })?;
        }
        Ok(catalog)
    }

    /// No tool may be named as another's undo action: `tool:<name>.undo` names one action.
    fn check_undo_names(&self, file: &str) -> Result<(), CatalogError> {
        for tool in &self.tools {
            let Some(undone) = tool.name.strip_suffix(".undo").and_then(|n| self.get(n)) else {
                continue;
            };
            if undone.undo.is_some() {
                return Err(CatalogError::Tool {
                    file: file.to_owned(),
                    line: tool.line,
                    tool: tool.name.clone(),
                    problem: ToolProblem::UndoName {
                        tool_line: undone.line,
                    },
                });
            }
        }
        Ok(())
    }

    /// The labels of the `[[host]]` entries.
    pub fn host_labels(&self) -> &HostLabels {
        &self.hosts
    }

    /// The labels a session takes on when policy allows it this request: those of the host
    /// it goes to and of the tool it calls (if any), each once, sorted.
    pub fn labels_for(&self, host: &str, tool: Option<&Tool>) -> Vec<String> {
        let mut labels: Vec<String> = self
            .hosts
            .of(host)
            .chain(
                tool.into_iter()
                    .flat_map(|t| t.labels.iter().map(String::as_str)),
            )
            .map(str::to_owned)
            .collect();
        labels.sort_unstable();
        labels.dedup();
        labels
    }

    /// The catalog file's name and text; `None` when there was no file (an empty catalog).
    pub fn source(&self) -> Option<(&str, &str)> {
        self.source
            .as_ref()
            .map(|(name, text)| (name.as_str(), text.as_str()))
    }

    /// The argument schema files the tools name (path as written in the catalog, text as
    /// read), in the order the tools name them; a file named twice is listed twice.
    pub fn schema_files(&self) -> impl Iterator<Item = (&str, &str)> {
        self.schema_files
            .iter()
            .map(|(name, text)| (name.as_str(), text.as_str()))
    }

    /// The tools, in file order.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The tool of this name.
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.by_name.get(name).map(|&i| &self.tools[i])
    }

    pub fn len(&self) -> usize {
        self.tools.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The `name` of the `[[tool]]` entry holding byte `offset`, if the file is TOML at all: the
/// entry opened by the last `[[tool]]` header before the offset.
fn tool_at(text: &str, offset: usize) -> Option<String> {
    let before = &text[..offset.min(text.len())];
    let index = before
        .lines()
        .filter(|line| line.trim_start().starts_with("[[tool]]"))
        .count()
        .checked_sub(1)?;
    let lenient: LenientFile = toml::from_str(text).ok()?;
    lenient
        .tool
        .get(index)?
        .get("name")?
        .as_str()
        .map(str::to_owned)
}

/// `schema_files` collects the text of each argument schema file read, as it was read: the
/// bytes the tool's schema came from, not a second read that could see a later edit.
fn check_tool(
    raw: RawTool,
    line: usize,
    dir: Option<&Path>,
    schema_files: &mut Vec<(String, String)>,
) -> Result<Tool, ToolProblem> {
    let name = raw.name.into_inner();
    if !is_tool_name(&name) {
        return Err(ToolProblem::InvalidName);
    }
    let matcher = check_match(raw.matcher)?;
    check_labels(&raw.labels)?;
    if let Some(pointer) = raw.impact.as_ref().and_then(|i| i.records.as_ref()) {
        check_pointer(pointer).map_err(|reason| ToolProblem::Pointer {
            pointer: pointer.clone(),
            reason,
        })?;
    }
    if let Some(cost) = raw.cost {
        if !(cost.is_finite() && (0.0..=1e12).contains(&cost)) {
            return Err(ToolProblem::Cost(cost));
        }
    }
    let args_schema = match raw.args_schema {
        None => None,
        Some(Value::String(rel)) => {
            let Some(dir) = dir else {
                return Err(ToolProblem::Schema(format!(
                    "{rel:?} is a path, but this catalog has no directory to resolve it in"
                )));
            };
            let path = dir.join(&rel);
            let text = std::fs::read_to_string(&path)
                .map_err(|source| ToolProblem::SchemaRead { path, source })?;
            let value: Value = serde_json::from_str(&text)
                .map_err(|e| ToolProblem::Schema(format!("{rel}: not JSON: {e}")))?;
            schema_files.push((rel, text));
            Some(value)
        }
        Some(value @ Value::Object(_)) => Some(value),
        Some(other) => {
            return Err(ToolProblem::Schema(format!(
                "expected an inline table or a path, got {other}"
            )))
        }
    };
    let (mut args, omitted) = match &args_schema {
        Some(schema) => args::from_json_schema(schema).map_err(ToolProblem::Schema)?,
        None => (RecordType::default(), Vec::new()),
    };
    // Path parameters are always strings and always present; a schema may say more about
    // them (then its type stands), but must not be needed to read them.
    if let ToolMatch::Rest { path, .. } = &matcher {
        for param in path.params() {
            args.ensure_string(param);
        }
    }
    let undo = match raw.undo {
        Some(undo) => Some(crate::undo::check(
            undo,
            (raw.tier, raw.reversible),
            &matcher,
            args_schema.is_some().then_some(&args),
        )?),
        None => None,
    };
    // A tool that declares how to reverse it is reversible unless it says otherwise (which
    // `check_undo` refuses).
    let reversible = raw
        .reversible
        .unwrap_or(undo.is_some() || matches!(raw.tier, Tier::Read | Tier::Write));
    Ok(Tool {
        name,
        line,
        tier: raw.tier,
        matcher,
        args_schema_text: args_schema.as_ref().map(Value::to_string),
        args_schema,
        args,
        omitted,
        impact_records: raw.impact.and_then(|i| i.records),
        cost: raw.cost,
        credential: raw.credential,
        reversible,
        labels: raw.labels,
        undo,
    })
}

/// Tool names become the action id `"tool:<name>"` and appear in schema text and URLs, so
/// they are kept to a conservative alphabet rather than escaped everywhere.
fn is_tool_name(name: &str) -> bool {
    name.len() <= 128
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

fn check_match(raw: RawMatch) -> Result<ToolMatch, ToolProblem> {
    let bad = |m: &str| ToolProblem::Match(m.to_owned());
    match raw {
        RawMatch {
            host: Some(host),
            method: Some(method),
            path: Some(path),
            mcp: None,
            tool: None,
        } => {
            if host.is_empty()
                || host.contains(|c: char| {
                    c.is_ascii_uppercase() || c.is_whitespace() || matches!(c, '/' | ':')
                })
            {
                return Err(bad(
                    "host must be a lowercase host name or IPv4 address, without scheme, port or path",
                ));
            }
            if method.is_empty() || !method.chars().all(|c| c.is_ascii_uppercase()) {
                return Err(bad("method must be an uppercase HTTP method (\"POST\")"));
            }
            let path = PathTemplate::parse(&path).map_err(|reason| ToolProblem::PathTemplate {
                path: path.clone(),
                reason,
            })?;
            Ok(ToolMatch::Rest { host, method, path })
        }
        RawMatch {
            host: None,
            method: None,
            path: None,
            mcp: Some(endpoint),
            tool: Some(tool),
        } => {
            let url = url::Url::parse(&endpoint).map_err(|e| ToolProblem::Endpoint {
                url: endpoint.clone(),
                reason: e.to_string(),
            })?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(ToolProblem::Endpoint {
                    url: endpoint,
                    reason: "the scheme must be http or https, with a host".into(),
                });
            }
            if tool.is_empty() {
                return Err(bad("tool (the MCP tool name) is empty"));
            }
            Ok(ToolMatch::Mcp {
                endpoint: url,
                tool,
            })
        }
        _ => Err(bad(
            "expected { host, method, path } for a REST route or { mcp, tool } for an MCP tool",
        )),
    }
}

/// RFC 6901: empty (the whole document) or `/`-separated tokens where `~` is only ever
/// followed by `0` or `1`.
fn check_pointer(pointer: &str) -> Result<(), String> {
    if !pointer.is_empty() && !pointer.starts_with('/') {
        return Err("must be empty or start with `/`".into());
    }
    let mut chars = pointer.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return Err("`~` must be followed by 0 or 1 (`~0` is `~`, `~1` is `/`)".into());
        }
    }
    Ok(())
}
