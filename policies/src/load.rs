//! Loading a policy set: read the tool catalog (`tools.toml`), generate the schema from it,
//! parse every `*.cedar` file, name each policy by its `@id`, and validate the whole set
//! strictly against the generated schema before anything evaluates it.
//!
//! Errors name the file and line so that a security engineer can fix a policy without
//! guessing; a set that fails any step is never returned, so callers keep their last good one.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use cedar_policy::{
    ActionConstraint, Authorizer, Effect, EntityUid, PolicyId, PolicySet, ResourceConstraint,
    Schema, ValidationMode, Validator,
};
use miette::Diagnostic;

use crate::catalog::{Catalog, CatalogError, CATALOG_FILE};
use crate::triggers::Triggers;

/// One policy file: a name for error messages and its text.
#[derive(Debug, Clone)]
pub struct PolicySource {
    /// File name (or any label) shown in errors and used to name policies without `@id`.
    pub name: String,
    /// Cedar policy text.
    pub text: String,
}

/// Why a policy set could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading policy directory {dir}: {source}")]
    ReadDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {path}: {source}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `tools.toml` is unreadable or invalid.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The generated schema does not parse: a bug in the generator, never the user's input.
    #[error("the generated schema does not parse: {0}")]
    Schema(String),
    #[error("{file}:{line}: {message}")]
    Parse {
        file: String,
        line: usize,
        message: String,
    },
    #[error(
        "{file}: policy id {id:?} is used twice (ids come from @id(\"...\") and must be unique)"
    )]
    DuplicateId { file: String, id: String },
    #[error("policy set failed strict validation:\n{}", .0.join("\n"))]
    Validation(Vec<String>),
    #[error("policy directory {0} holds no *.cedar file")]
    Empty(PathBuf),
}

/// A validated policy set with its schema, ready to decide requests.
#[derive(Debug)]
pub struct PolicyEngine {
    catalog: Catalog,
    /// The generated schema as text (`ostiary policy schema`).
    schema_text: String,
    schema: Schema,
    policies: PolicySet,
    authorizer: Authorizer,
    names: crate::decide::Names,
    /// Which policies each request needs evaluated (see `index.rs`).
    index: crate::index::PolicyIndex,
    /// Hosts some `http` permit names in its scope; `None` when a permit's scope admits any
    /// host (then only evaluation can tell). Lets CONNECT refuse hosts no request could reach.
    http_permit_hosts: Option<HashSet<String>>,
    /// Which file each policy came from, for audit and explanations.
    origins: HashMap<String, String>,
    /// Decisions' entity sets, built once per agent, tenant and resource (entities.rs).
    entity_cache: crate::entities::EntityCache,
    /// The context attributes some policy reads; a decision builds only those.
    context_use: crate::context_use::ContextUse,
    /// Decisions already made, by what their requests put into them (memo.rs).
    memo: crate::memo::Memo,
    /// The set's content-addressed id (`version.rs`), recorded with every decision.
    version: crate::version::PolicyVersion,
}

/// The regular files of `dir` ending in `.<ext>`, sorted by name (not recursive): policy
/// files and policy test files are both found this way, so they are read in the same order.
pub(crate) fn files_with_extension(dir: &Path, ext: &str) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == ext) && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths)
}

impl PolicyEngine {
    /// Load the catalog `dir/tools.toml` (absent: empty) and every `*.cedar` file of `dir`
    /// (sorted by name, not recursive).
    pub fn load_dir(dir: &Path) -> Result<Self, LoadError> {
        Self::load_dir_with(dir, &Triggers::default())
    }

    /// [`Self::load_dir`] for a config with `triggers` (they type `Action::"trigger"`).
    pub fn load_dir_with(dir: &Path, triggers: &Triggers) -> Result<Self, LoadError> {
        let paths = files_with_extension(dir, "cedar").map_err(|source| LoadError::ReadDir {
            dir: dir.to_owned(),
            source,
        })?;
        if paths.is_empty() {
            return Err(LoadError::Empty(dir.to_owned()));
        }
        let mut sources = Vec::with_capacity(paths.len());
        for path in paths {
            let text = std::fs::read_to_string(&path).map_err(|source| LoadError::ReadFile {
                path: path.clone(),
                source,
            })?;
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            sources.push(PolicySource { name, text });
        }
        let catalog = Catalog::load_dir(dir)?;
        Self::with_triggers(&sources, catalog, triggers)
    }

    /// The library shipped with Ostiary: [`crate::EMBEDDED_LIBRARY`] with its catalog
    /// [`crate::EMBEDDED_CATALOG`], the same policies and tools as `policies/library/` on disk.
    pub fn embedded() -> Result<Self, LoadError> {
        Self::embedded_with(&Triggers::default())
    }

    /// [`Self::embedded`] for a config with `triggers`.
    pub fn embedded_with(triggers: &Triggers) -> Result<Self, LoadError> {
        let sources: Vec<PolicySource> = crate::EMBEDDED_LIBRARY
            .iter()
            .map(|(name, text)| PolicySource {
                name: (*name).to_owned(),
                text: (*text).to_owned(),
            })
            .collect();
        // No directory: the shipped catalog gives its argument schemas inline, so there is no
        // schema file to resolve (a path would be refused here, not looked up somewhere else).
        let catalog = Catalog::parse(CATALOG_FILE, crate::EMBEDDED_CATALOG, None)?;
        Self::with_triggers(&sources, catalog, triggers)
    }

    /// Build from in-memory sources with an empty catalog (the embedded library, tests).
    pub fn from_sources(sources: &[PolicySource]) -> Result<Self, LoadError> {
        Self::with_catalog(sources, Catalog::default())
    }

    /// Build from in-memory sources and a catalog: the schema is generated from the catalog
    /// and every policy is strictly validated against it.
    pub fn with_catalog(sources: &[PolicySource], catalog: Catalog) -> Result<Self, LoadError> {
        Self::with_triggers(sources, catalog, &Triggers::default())
    }

    /// [`Self::with_catalog`] for a config with `triggers`: the schema's `trigger` action
    /// types their payloads ([`crate::triggers`]).
    pub fn with_triggers(
        sources: &[PolicySource],
        catalog: Catalog,
        triggers: &Triggers,
    ) -> Result<Self, LoadError> {
        let schema_text = crate::schema::generate(&catalog, triggers);
        let (schema, _warnings) = Schema::from_cedarschema_str(&schema_text)
            .map_err(|e| LoadError::Schema(format!("{e:?}")))?;

        let mut policies = PolicySet::new();
        let mut origins = HashMap::new();
        // Validation errors locate a policy by byte offsets into the text it was parsed from,
        // and each file is parsed on its own: the line needs that file's text.
        let mut texts: HashMap<String, &str> = HashMap::new();
        for source in sources {
            let parsed: PolicySet =
                source
                    .text
                    .parse()
                    .map_err(|e: cedar_policy::ParseErrors| {
                        parse_error(&source.name, &source.text, &e)
                    })?;
            for (index, policy) in parsed.policies().enumerate() {
                let id = policy
                    .annotation("id")
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("{}#{index}", source.name));
                if origins.contains_key(&id) {
                    return Err(LoadError::DuplicateId {
                        file: source.name.clone(),
                        id,
                    });
                }
                let renamed = policy.new_id(PolicyId::new(&id));
                policies.add(renamed).map_err(|e| LoadError::Parse {
                    file: source.name.clone(),
                    line: 0,
                    message: e.to_string(),
                })?;
                texts.insert(id.clone(), &source.text);
                origins.insert(id, source.name.clone());
            }
        }

        let result = Validator::new(schema.clone()).validate(&policies, ValidationMode::Strict);
        if !result.validation_passed() {
            let errors = result
                .validation_errors()
                .map(|e| {
                    let id = e.policy_id().to_string();
                    let file = origins.get(&id).map(String::as_str).unwrap_or("?");
                    let offset = e
                        .labels()
                        .and_then(|mut labels| labels.next())
                        .map(|label| label.offset());
                    match (offset, texts.get(&id)) {
                        (Some(offset), Some(text)) => {
                            format!("{file}:{}: policy {id}: {e}", line_of(text, offset))
                        }
                        // No location to point at: the file and policy id still find it.
                        _ => format!("{file}: policy {id}: {e}"),
                    }
                })
                .collect();
            return Err(LoadError::Validation(errors));
        }

        let context_use = crate::context_use::ContextUse::of(&policies);
        Ok(Self {
            http_permit_hosts: http_permit_hosts(&policies),
            index: crate::index::PolicyIndex::new(&policies),
            memo: crate::memo::Memo::new(context_use.session_reads()),
            context_use,
            names: crate::decide::Names::new(&catalog, triggers).map_err(LoadError::Schema)?,
            version: crate::version::PolicyVersion::of(sources, &catalog, &schema_text),
            catalog,
            schema_text,
            schema,
            policies,
            authorizer: Authorizer::new(),
            origins,
            entity_cache: Default::default(),
        })
    }

    /// The set's content-addressed version id (`sha256:<16 hex digits>`, see `version.rs`).
    pub fn version(&self) -> &crate::version::PolicyVersion {
        &self.version
    }

    /// The generated schema in Cedar's human syntax (`ostiary policy schema`).
    pub fn schema_text(&self) -> &str {
        &self.schema_text
    }

    /// The tool catalog the schema was generated from.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The schema requests are validated against.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The validated policies.
    pub fn policy_set(&self) -> &PolicySet {
        &self.policies
    }

    pub(crate) fn entity_cache(&self) -> &crate::entities::EntityCache {
        &self.entity_cache
    }

    pub(crate) fn authorizer(&self) -> &Authorizer {
        &self.authorizer
    }

    pub(crate) fn names(&self) -> &crate::decide::Names {
        &self.names
    }

    /// This engine building every context attribute, read or not: the reference the
    /// pruned context is tested against (`tests/index_differential.rs`).
    #[doc(hidden)]
    pub fn building_whole_context(mut self) -> Self {
        self.context_use = crate::context_use::ContextUse::everything();
        self.memo = crate::memo::Memo::off();
        self
    }

    /// How many decisions the engine keeps (memo.rs): lets the differential test show that
    /// its requests were answered from kept decisions too.
    #[doc(hidden)]
    pub fn kept_decisions(&self) -> usize {
        self.memo.len()
    }

    pub(crate) fn memo(&self) -> &crate::memo::Memo {
        &self.memo
    }

    pub(crate) fn context_use(&self) -> &crate::context_use::ContextUse {
        &self.context_use
    }

    pub(crate) fn index(&self) -> &crate::index::PolicyIndex {
        &self.index
    }

    /// Number of policies in the set.
    pub fn len(&self) -> usize {
        self.origins.len()
    }

    /// True when the set holds no policy (everything is denied).
    pub fn is_empty(&self) -> bool {
        self.origins.is_empty()
    }

    /// Whether any inspected request to `host` — `Action::"http"` or `Action::"mcp"`, the
    /// two actions decided inside an intercepted tunnel on its `Host` — could be permitted,
    /// judged from the scopes of the permits alone (sound: `false` only when no permit's
    /// scope can match the host).
    pub fn may_permit_http(&self, host: &str) -> bool {
        self.http_permit_hosts
            .as_ref()
            .is_none_or(|hosts| hosts.contains(host))
    }

    /// The file a policy came from.
    pub fn origin(&self, policy_id: &str) -> Option<&str> {
        self.origins.get(policy_id).map(String::as_str)
    }
}

/// The hosts named by the resource scopes of permits that can apply to `Action::"http"` or
/// `Action::"mcp"`, or `None` if one of them admits any host (unscoped, `in`, or `is`).
///
/// Neither is in an action group (only tool actions are, in their tier groups), so a permit
/// scoped to `action in [...]` applies to them only when the list names one itself.
fn http_permit_hosts(policies: &PolicySet) -> Option<HashSet<String>> {
    let mut hosts = HashSet::new();
    for policy in policies.policies() {
        if policy.effect() != Effect::Permit {
            continue;
        }
        let applies = match policy.action_constraint() {
            ActionConstraint::Any => true,
            ActionConstraint::Eq(a) => is_http(&a),
            ActionConstraint::In(list) => list.iter().any(is_http),
            // Future constraint kinds: assume the permit may apply (sound).
            #[allow(unreachable_patterns)]
            _ => true,
        };
        if !applies {
            continue;
        }
        match policy.resource_constraint() {
            ResourceConstraint::Eq(uid) if uid.type_name().to_string() == "Ostiary::Host" => {
                hosts.insert(uid.id().unescaped().to_owned());
            }
            ResourceConstraint::Eq(_) => {}
            _ => return None,
        }
    }
    Some(hosts)
}

fn is_http(uid: &EntityUid) -> bool {
    uid.type_name().to_string() == "Ostiary::Action"
        && matches!(uid.id().unescaped(), "http" | "mcp")
}

/// Turn Cedar's parse error into `file:line: message`, taking the line from the first label.
fn parse_error(file: &str, text: &str, errors: &cedar_policy::ParseErrors) -> LoadError {
    let offset = errors
        .labels()
        .and_then(|mut labels| labels.next())
        .map(|label| label.offset())
        .unwrap_or(0);
    LoadError::Parse {
        file: file.to_owned(),
        line: line_of(text, offset),
        message: errors.to_string(),
    }
}

/// The 1-based line of byte `offset` in `text`. Counted over bytes, so an offset that is not
/// on a character boundary (or past the end) cannot panic; past the end is the last line.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}
