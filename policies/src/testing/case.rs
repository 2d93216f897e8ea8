//! One test case as a policy test file writes it (`[[case]]`), and the request it stands
//! for: the action, the session so far, what the proxy would observe of a tool call, checked
//! against the catalog so that a case cannot claim what the proxy would never compute.

use super::*;

/// The decision a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expect {
    Allow,
    Deny,
    /// Denied, pending a human's approval ([`Decision::Escalate`]).
    Escalate,
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Expect::Allow => "allow",
            Expect::Deny => "deny",
            Expect::Escalate => "escalate",
        })
    }
}

/// The action of a case. A string in the file; parsed here so that an unknown action (a
/// Cedar action id such as `tool:github.create_issue`, a typo) fails with a message that says
/// what to write instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum CaseAction {
    Http,
    Connect,
    /// A JSON-RPC message other than `tools/call` (`method`) to an MCP endpoint (`server`).
    Mcp,
    /// A child session under the agent name `child`.
    Spawn,
    /// A call of the catalog tool named by the case's `tool`.
    Tool,
    /// The trigger named by the case's `trigger` about to start a run.
    Trigger,
}

impl TryFrom<String> for CaseAction {
    type Error = String;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        match value.as_str() {
            "http" => Ok(CaseAction::Http),
            "connect" => Ok(CaseAction::Connect),
            "mcp" => Ok(CaseAction::Mcp),
            "spawn" => Ok(CaseAction::Spawn),
            "tool" => Ok(CaseAction::Tool),
            "trigger" => Ok(CaseAction::Trigger),
            other => Err(format!(
                "unknown action {other:?}: expected \"http\", \"connect\", \"mcp\", \"spawn\", \"tool\" or \"trigger\" \
                 (a tool call is `action = \"tool\"` with the catalog name in `tool = \"...\"`)"
            )),
        }
    }
}

/// `session = { calls = 3, cost = 0.5, depth = 1, parent_agent = "planner" }` of a case: what
/// the session did before this request, and where it sits in the spawn tree. Absent fields
/// are 0 or empty, as for a root session's first request.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseSession {
    #[serde(default)]
    pub calls: i64,
    /// In the catalog's units (`0.5`), as `cost` is written in `tools.toml`; policies see
    /// micro-units (`500000`).
    #[serde(default)]
    pub cost: f64,
    #[serde(default)]
    pub depth: i64,
    /// The parent session's agent; empty for a root session.
    #[serde(default)]
    pub parent_agent: String,
    /// The sandbox profile; empty for none.
    #[serde(default)]
    pub profile: String,
    /// `context.session.labels`: what the session touched; default none.
    #[serde(default)]
    pub labels: Vec<String>,
    /// `context.session.recent`; default all 0.
    #[serde(default)]
    pub recent: CaseRecent,
}

/// `session.recent` of a case: the request's tool's and tier's recent calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseRecent {
    #[serde(default)]
    pub tool_10m: i64,
    #[serde(default)]
    pub tool_1h: i64,
    #[serde(default)]
    pub tier_10m: i64,
    #[serde(default)]
    pub tier_1h: i64,
}

impl CaseRecent {
    /// From `WINDOW=N` words (`tool_1h=3`), as `ostiary policy explain --session-recent`
    /// takes them; unnamed windows are 0.
    pub fn parse(words: &[String]) -> Result<Self, String> {
        let mut recent = Self::default();
        for word in words {
            let (window, n) = word
                .split_once('=')
                .ok_or_else(|| format!("{word:?}: expected WINDOW=N, e.g. tool_1h=3"))?;
            let n: i64 = n
                .parse()
                .map_err(|e| format!("{word:?}: {n:?} is not a count: {e}"))?;
            let slot = match window {
                "tool_10m" => &mut recent.tool_10m,
                "tool_1h" => &mut recent.tool_1h,
                "tier_10m" => &mut recent.tier_10m,
                "tier_1h" => &mut recent.tier_1h,
                other => {
                    return Err(format!(
                        "{other:?}: the windows are tool_10m, tool_1h, tier_10m and tier_1h"
                    ))
                }
            };
            *slot = n;
        }
        Ok(recent)
    }
}

impl CaseSession {
    /// `context.session`, or why these numbers cannot be a session's.
    pub fn state(&self) -> Result<SessionState, String> {
        if self.calls < 0 || self.depth < 0 {
            return Err("session.calls and session.depth must not be negative".into());
        }
        // The same bound the catalog puts on a tool's cost, so the conversion is exact.
        if !(self.cost.is_finite() && (0.0..=1e12).contains(&self.cost)) {
            return Err(format!(
                "session.cost must be a finite number between 0 and 1e12, got {}",
                self.cost
            ));
        }
        if self.depth == 0 && !self.parent_agent.is_empty() {
            return Err(
                "session.parent_agent is set but session.depth is 0: a child is at depth 1 or more"
                    .into(),
            );
        }
        if let Some(bad) = self.labels.iter().find(|l| !crate::labels::is_label(l)) {
            return Err(format!(
                "session.labels: {bad:?} is not a label (1-64 of `a-z`, `0-9`, `_`, starting \
                 with a letter)"
            ));
        }
        let r = &self.recent;
        // The hour holds the ten minutes: its count is at least theirs.
        if [r.tool_10m, r.tool_1h, r.tier_10m, r.tier_1h]
            .iter()
            .any(|n| *n < 0)
            || r.tool_10m > r.tool_1h
            || r.tier_10m > r.tier_1h
        {
            return Err(
                "session.recent: counts must not be negative, and an hour's at least ten \
                 minutes'"
                    .into(),
            );
        }
        Ok(SessionState {
            calls: self.calls,
            cost_micros: cost_to_micros(self.cost),
            depth: self.depth,
            parent_agent: self.parent_agent.clone(),
            profile: self.profile.clone(),
            labels: self.labels.iter().cloned().collect(),
            recent: Recent {
                tool_10m: r.tool_10m,
                tool_1h: r.tool_1h,
                tier_10m: r.tier_10m,
                tier_1h: r.tier_1h,
            },
        })
    }
}

/// One `[[case]]` of a test file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    #[serde(default = "default_agent")]
    pub agent: String,
    #[serde(default = "default_tenant")]
    pub tenant: String,
    pub action: CaseAction,
    /// http and connect: required. Not for tool cases: their resource is the tool, and the
    /// host serving it comes from the catalog.
    pub host: Option<String>,
    /// http: the HTTP method, default `GET`; mcp, required: the JSON-RPC method.
    pub method: Option<String>,
    /// mcp only; default `https://<host>/mcp`: the endpoint's URL.
    pub server: Option<String>,
    /// spawn only, required: the agent name the child asks for.
    pub child: Option<String>,
    /// http only; default `https`.
    pub scheme: Option<String>,
    /// http and connect; default 443 (80 for an http case with `scheme = "http"`).
    pub port: Option<u16>,
    /// http only; default `/`.
    pub path: Option<String>,
    /// http only; default empty.
    pub query: Option<String>,
    /// connect only; default the host.
    pub sni: Option<String>,
    /// tool only, required: the catalog name (`github.create_issue`).
    pub tool: Option<String>,
    /// tool only; default `{}`: the arguments as the agent sends them (for a REST tool, the
    /// path parameters, query and body merged, as the proxy merges them).
    pub args: Option<Map<String, Value>>,
    /// tool only; default false: the call's undo (`Action::"tool:<name>.undo"`, the tool
    /// must declare one), decided with the call's `args`.
    pub undo: Option<bool>,
    /// Every action; default all 0 and empty (a root session's first request).
    pub session: Option<CaseSession>,
    /// tool and trigger: a human approved this call (`context.approval.granted`, `approver`).
    pub approved_by: Option<String>,
    /// trigger only, required: the trigger's name (`[[trigger]]` of the config).
    pub trigger: Option<String>,
    /// trigger only; default `webhook`: the trigger's kind.
    pub kind: Option<String>,
    /// trigger only; default `{}`: the payload as delivered.
    pub payload: Option<Map<String, Value>>,
    pub expect: Expect,
    /// The exact determining policy ids, in any order. Absent: not checked.
    pub policies: Option<Vec<String>>,
}

fn default_agent() -> String {
    "agent".to_owned()
}

fn default_tenant() -> String {
    "default".to_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TestFile {
    #[serde(default)]
    pub(super) case: Vec<Spanned<Case>>,
}

impl Case {
    /// The request this case describes, a tool call's impact taken from `catalog`. Fields of
    /// another action are refused rather than ignored: a `method` on a connect case, or `args`
    /// on an http case, means the author misunderstood the case.
    pub fn request(&self, catalog: &Catalog) -> Result<AccessRequest, String> {
        self.check_fields_of_other_actions()?;
        let (host, action) = match self.action {
            CaseAction::Http => self.http()?,
            CaseAction::Connect => self.connect()?,
            CaseAction::Mcp => self.mcp()?,
            CaseAction::Spawn => self.spawn()?,
            CaseAction::Trigger => self.trigger()?,
            CaseAction::Tool => {
                let mut http_only = self.http_only().to_vec();
                http_only.push(("method", self.method.is_some()));
                self.tool_call(catalog, &http_only)?
            }
        };
        Ok(AccessRequest {
            agent: self.agent.clone(),
            tenant: self.tenant.clone(),
            host,
            session: self.session.clone().unwrap_or_default().state()?,
            action,
        })
    }

    /// The fields only http cases take, and whether this case gives each.
    fn http_only(&self) -> [(&'static str, bool); 3] {
        [
            ("scheme", self.scheme.is_some()),
            ("path", self.path.is_some()),
            ("query", self.query.is_some()),
        ]
    }

    /// A field that belongs to one action alone, given on a case of another.
    fn check_fields_of_other_actions(&self) -> Result<(), String> {
        let tool_only = [
            ("tool", self.tool.is_some()),
            ("args", self.args.is_some()),
            ("undo", self.undo.is_some()),
        ];
        let trigger_only = [
            ("trigger", self.trigger.is_some()),
            ("kind", self.kind.is_some()),
            ("payload", self.payload.is_some()),
        ];
        if self.action != CaseAction::Tool {
            if let Some(field) = first_given(&tool_only) {
                return Err(format!("`{field}` applies to tool cases only"));
            }
        }
        if self.action != CaseAction::Trigger {
            if let Some(field) = first_given(&trigger_only) {
                return Err(format!("`{field}` applies to trigger cases only"));
            }
        }
        if !matches!(self.action, CaseAction::Tool | CaseAction::Trigger)
            && self.approved_by.is_some()
        {
            return Err("`approved_by` applies to tool and trigger cases only".into());
        }
        if self.action != CaseAction::Mcp && self.server.is_some() {
            return Err("`server` applies to mcp cases only".into());
        }
        if self.action != CaseAction::Spawn && self.child.is_some() {
            return Err("`child` applies to spawn cases only".into());
        }
        Ok(())
    }

    fn http(&self) -> Result<(String, Action), String> {
        let host = self.host()?;
        if self.sni.is_some() {
            return Err("`sni` applies to connect cases only".into());
        }
        let action = http_call(HttpParts {
            method: self.method.clone(),
            scheme: self.scheme.clone(),
            port: self.port,
            path: self.path.clone(),
            query: self.query.clone(),
        });
        Ok((host, action))
    }

    fn connect(&self) -> Result<(String, Action), String> {
        let host = self.host()?;
        if let Some(field) =
            first_given(&self.http_only()).or(self.method.is_some().then_some("method"))
        {
            return Err(format!("`{field}` applies to http cases only"));
        }
        let action = Action::Connect {
            port: self.port.unwrap_or(443),
            sni: self.sni.clone().unwrap_or_else(|| host.clone()),
        };
        Ok((host, action))
    }

    fn mcp(&self) -> Result<(String, Action), String> {
        let host = self.host()?;
        let not_for_mcp = [("port", self.port.is_some()), ("sni", self.sni.is_some())];
        if let Some(field) = first_given(&self.http_only()).or_else(|| first_given(&not_for_mcp)) {
            return Err(format!(
                "`{field}` does not apply to mcp cases: an mcp case is `host`, `method` \
                 (the JSON-RPC method) and optionally `server`"
            ));
        }
        let method = self
            .method
            .clone()
            .ok_or("`method` (the JSON-RPC method) is required for mcp cases")?;
        let server = self
            .server
            .clone()
            .unwrap_or_else(|| format!("https://{host}/mcp"));
        Ok((host, Action::Mcp { method, server }))
    }

    /// The fields a case without a host (spawn, trigger) must not give.
    fn hostless_field(&self) -> Option<&'static str> {
        let not_hostless = [
            ("host", self.host.is_some()),
            ("method", self.method.is_some()),
            ("port", self.port.is_some()),
            ("sni", self.sni.is_some()),
        ];
        first_given(&self.http_only()).or_else(|| first_given(&not_hostless))
    }

    fn spawn(&self) -> Result<(String, Action), String> {
        if let Some(field) = self.hostless_field() {
            return Err(format!(
                "`{field}` does not apply to spawn cases: a spawn case is `agent` (the \
                 parent's), `child` and `session`"
            ));
        }
        let child = self
            .child
            .clone()
            .ok_or("`child` (the agent name asked for) is required for spawn cases")?;
        if child.is_empty() {
            return Err("`child` is empty".into());
        }
        Ok((String::new(), Action::Spawn { child }))
    }

    fn trigger(&self) -> Result<(String, Action), String> {
        if let Some(field) = self.hostless_field() {
            return Err(format!(
                "`{field}` does not apply to trigger cases: a trigger case is `agent` \
                 (the run's), `trigger`, `kind`, `payload`, `session` and `approved_by`"
            ));
        }
        let name = self
            .trigger
            .clone()
            .ok_or("`trigger` (the trigger's name) is required for trigger cases")?;
        let kind = self.kind.clone().unwrap_or_else(|| "webhook".to_owned());
        if !["webhook", "schedule", "api"].contains(&kind.as_str()) {
            return Err(format!(
                "`kind` {kind:?}: expected \"webhook\", \"schedule\" or \"api\""
            ));
        }
        let action = Action::Trigger {
            name,
            kind,
            payload: Value::Object(self.payload.clone().unwrap_or_default()),
            approval: self.approved_by.clone(),
        };
        Ok((String::new(), action))
    }

    /// The host of an http or connect case, checked.
    fn host(&self) -> Result<String, String> {
        let host = self
            .host
            .as_deref()
            .ok_or("`host` is required for http and connect cases")?;
        check_host(host)?;
        Ok(host.to_owned())
    }

    /// The host and action of a tool case: what the proxy would build for this call.
    fn tool_call(
        &self,
        catalog: &Catalog,
        http_only: &[(&'static str, bool)],
    ) -> Result<(String, Action), String> {
        let not_for_tools = [
            ("host", self.host.is_some()),
            ("port", self.port.is_some()),
            ("sni", self.sni.is_some()),
        ];
        if let Some(field) = first_given(http_only).or_else(|| first_given(&not_for_tools)) {
            return Err(format!(
                "`{field}` does not apply to tool cases: a tool call is described by `tool`, \
                 `args`, `session` and `approved_by`; the catalog says where the tool is served"
            ));
        }
        let name = self
            .tool
            .as_deref()
            .ok_or("`tool` is required for tool cases (the tool's name in tools.toml)")?;
        let (host, action) = tool_call(
            catalog,
            name,
            self.args.clone().unwrap_or_default(),
            self.approved_by.as_deref(),
        )?;
        match self.undo {
            Some(true) => Ok((host, undo_of(catalog, action)?)),
            _ => Ok((host, action)),
        }
    }
}

/// The undo of a tool call built by [`tool_call`]: `Action::"tool:<name>.undo"`, for a tool
/// that declares one. Shared by tool cases and `ostiary policy explain --tool --undo`.
pub fn undo_of(catalog: &Catalog, mut action: Action) -> Result<Action, String> {
    let Action::Tool { name, undo, .. } = &mut action else {
        return Err("only a tool call has an undo".into());
    };
    if catalog.get(name).and_then(|t| t.undo()).is_none() {
        return Err(format!(
            "tool {name:?} declares no undo (`undo = {{ method, path }}` in tools.toml)"
        ));
    }
    *undo = true;
    Ok(action)
}

/// What an http case (or `ostiary policy explain --host`) says of a plain request; what
/// it leaves out takes the defaults of a plain GET of `/` over https.
#[derive(Debug, Clone, Default)]
pub struct HttpParts {
    pub method: Option<String>,
    pub scheme: Option<String>,
    pub port: Option<u16>,
    pub path: Option<String>,
    pub query: Option<String>,
}

/// `Action::"http"` of these parts, defaults filled in (the port from the scheme).
pub fn http_call(parts: HttpParts) -> Action {
    let scheme = parts.scheme.unwrap_or_else(|| "https".to_owned());
    let default_port = if scheme == "http" { 80 } else { 443 };
    Action::Http {
        method: parts.method.unwrap_or_else(|| "GET".to_owned()),
        port: parts.port.unwrap_or(default_port),
        scheme,
        path: parts.path.unwrap_or_else(|| "/".to_owned()),
        query: parts.query.unwrap_or_default(),
    }
}

/// The host and action of a call of catalog tool `name`: what the proxy would build for it,
/// given what it observed (the arguments, an approval). Shared by tool
/// cases and `ostiary policy explain --tool`, so the two cannot build different requests for
/// the same call.
pub fn tool_call(
    catalog: &Catalog,
    name: &str,
    args: Map<String, Value>,
    approved_by: Option<&str>,
) -> Result<(String, Action), String> {
    let Some(tool) = catalog.get(name) else {
        return Err(format!(
            "tool {name:?} is not in the catalog (tools.toml of the policy directory)"
        ));
    };
    let approval = match approved_by {
        Some("") => return Err("`approved_by` is empty: name the approver".into()),
        other => other.map(str::to_owned),
    };
    let args = Value::Object(args);
    let action = Action::Tool {
        name: name.to_owned(),
        // As the proxy computes them (recognise.rs): no extractor, or nothing at its
        // pointer, is no counted records; a value that is not a count is refused there, and
        // is an error of the case here.
        impact_records: tool.impact_records(&args).map_err(|e| e.to_string())?,
        cost_micros: tool.cost_micros(),
        approval,
        args,
        undo: false,
    };
    Ok((tool.server().to_owned(), action))
}
/// The first field of `fields` that the case sets.
fn first_given(fields: &[(&'static str, bool)]) -> Option<&'static str> {
    fields.iter().find(|(_, set)| *set).map(|(field, _)| *field)
}

/// Policies only ever see canonical hosts (the proxy canonicalises before deciding), so a
/// case with `PyPI.org` would test a request that cannot happen. Refuse the forms that are
/// plainly not canonical instead of guessing the proxy's full canonicalisation here.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() {
        return Err("`host` is empty".into());
    }
    if host
        .chars()
        .any(|c| c.is_ascii_uppercase() || c.is_whitespace())
        || host.ends_with('.')
        || host.starts_with('[')
    {
        return Err(format!(
            "host {host:?} is not canonical: write it lowercase, without a trailing dot, \
             brackets or port, as policies see it"
        ));
    }
    Ok(())
}
