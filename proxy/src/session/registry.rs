//! Live sessions: created through the control API, looked up on every request, torn down on
//! `DELETE` or expiry. Memory is the hot path; the session store makes sessions survive a
//! restart.
//!
//! A token is accepted only while its session is live here: a valid signature on a revoked
//! or expired session is still a 407, so a token replayed after teardown is refused.
//!
//! Replicas sharing a store ([`SessionRegistry::set_shared`]) learn of a session another
//! made when its token first arrives: the store says whether it is live. A session ended
//! here or elsewhere is remembered as ended ([`ENDED_FOR`]), so its token costs no lookup.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;

use super::token::{Claims, TokenError, TokenKeys, AUDIENCE, ISSUER};
use crate::ids::IdMap;
use crate::store::sessions::{NewSessionRow, SessionStore};
use crate::store::{now_ms, Call, StoreError};

/// The authenticated caller of one request. Serialised where it must outlive its session
/// (an undo journal entry is decided for the principal that made the call).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Principal {
    pub session_id: String,
    pub agent: String,
    pub tenant: String,
    /// Spawn depth (0 for a session created by an operator).
    pub depth: u32,
    /// The session that spawned this one (agent-to-agent), if any.
    pub parent: Option<String>,
    /// That session's agent (`context.session.parent_agent`); `None` for a root.
    pub parent_agent: Option<String>,
    /// The sandbox profile the session runs under (`context.session.profile`); a child's is
    /// its parent's.
    pub profile: Option<String>,
    /// Seconds since the epoch.
    pub expires_at: i64,
}

/// Body of `POST /v1/sessions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSession {
    /// The agent name. Required for a root session; a child runs as its parent's agent
    /// when it names none (or its parent's), and under another name only if policy
    /// permits the parent's agent to `spawn` it ([`super::spawn`]).
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub tenant: Option<String>,
    /// Lifetime, e.g. `"30m"`; `sessions.default_ttl` when absent.
    #[serde(default)]
    pub ttl: Option<String>,
    /// Hard limits of the session (`[sessions]` defaults when absent; a child's are carved
    /// out of its parent's remaining budget).
    #[serde(default)]
    pub max_calls: Option<u64>,
    #[serde(default)]
    pub max_cost: Option<f64>,
    #[serde(default)]
    pub max_bytes_sent: Option<u64>,
    #[serde(default)]
    pub max_bytes_received: Option<u64>,
    /// Requests the session may have held for approval at once (`[sessions]
    /// max_pending_approvals` when absent; a child's at most its parent's, which its holds
    /// count against too). Validated by the approval queue (`ApprovalQueue::cap_for`).
    #[serde(default)]
    pub max_pending_approvals: Option<u32>,
    /// The parent session (an operator creating a child on a session's behalf; a session
    /// creating its own child authenticates with its token instead).
    #[serde(default)]
    pub parent: Option<String>,
    /// The sandbox profile the session's agent runs under (`ostiary run --sandbox=NAME`):
    /// policies see it as `context.session.profile`. A child's is its parent's.
    #[serde(default)]
    pub profile: Option<String>,
}

/// Whether `name` may be a sandbox profile's name: 1-64 characters of `a-z 0-9 _ -`.
pub fn valid_profile_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Why a session operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Token(#[from] TokenError),
    #[error("session {0} is not active (unknown, revoked or expired)")]
    NotActive(String),
    /// A spawn bound (`depth`, `children`) was reached.
    #[error("{limit} limit reached: {used} of {max}")]
    Bound {
        limit: &'static str,
        used: u64,
        max: u64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The registry of live sessions.
pub struct SessionRegistry {
    keys: TokenKeys,
    db: Arc<dyn SessionStore>,
    live: RwLock<IdMap<String, Arc<Principal>>>,
    /// Verified tokens, so that a request does not pay a signature check. Keyed by the token
    /// itself; an entry never outlives the token's own `exp` (checked on every hit).
    verified: moka::sync::Cache<String, Arc<Principal>>,
    default_ttl: Duration,
    max_ttl: Duration,
    max_depth: u32,
    max_children: u32,
    /// Whether other replicas create sessions in the same store.
    shared: std::sync::atomic::AtomicBool,
    /// The sessions' labels and recent calls (`context.session.labels`, `.recent`).
    pub memory: super::memory::SessionMemory,
    /// Sessions known to have ended, so that their tokens are refused without a lookup.
    ended: moka::sync::Cache<String, ()>,
}

/// How long an ended session is remembered as ended (past any token's lifetime would be
/// needless: a token of an ended session is refused by the store too).
pub const ENDED_FOR: Duration = Duration::from_secs(3600);

impl std::fmt::Debug for SessionRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRegistry")
            .field("live", &self.live.read().map(|l| l.len()).unwrap_or(0))
            .finish_non_exhaustive()
    }
}

fn principal_of(row: crate::store::sessions::SessionRow) -> Principal {
    Principal {
        session_id: row.id,
        agent: row.agent,
        tenant: row.tenant,
        depth: row.depth,
        expires_at: row.expires_at,
        parent: row.parent,
        parent_agent: row.parent_agent,
        profile: row.profile,
    }
}

/// Check an agent or tenant name: 1-128 characters of `A-Za-z0-9._-@:`.
pub fn valid_name(what: &str, name: &str) -> Result<(), SessionError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-@:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(SessionError::Invalid(format!(
            "{what} must be 1-128 characters of A-Z a-z 0-9 . _ - @ :"
        )))
    }
}

impl SessionRegistry {
    /// Load the live sessions from the store.
    pub fn load(
        keys: TokenKeys,
        db: Arc<dyn SessionStore>,
        settings: &crate::config::Sessions,
    ) -> Result<Self, SessionError> {
        let now = now_ms() / 1000;
        let live = db
            .live(now)?
            .into_iter()
            .map(|row| {
                let p = principal_of(row);
                (p.session_id.clone(), Arc::new(p))
            })
            .collect::<IdMap<_, _>>();
        Ok(Self {
            keys,
            memory: super::memory::SessionMemory::new(db.clone()),
            db,
            live: RwLock::new(live),
            verified: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(300))
                // `revoke` drops a session's entries with `invalidate_entries_if`, which moka
                // refuses (and teardown would fail half-done) unless enabled here.
                .support_invalidation_closures()
                .build(),
            default_ttl: settings.default_ttl,
            max_ttl: settings.max_ttl,
            max_depth: settings.max_depth,
            max_children: settings.max_children,
            shared: std::sync::atomic::AtomicBool::new(false),
            ended: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(ENDED_FOR)
                .build(),
        })
    }

    /// Other replicas create and end sessions in the same store: look there for a session
    /// not known here.
    pub fn set_shared(&self) {
        self.shared
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn is_shared(&self) -> bool {
        self.shared.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The live session `id`, from the store if another replica made it.
    pub async fn find(&self, id: &str) -> Option<Arc<Principal>> {
        if let Some(p) = self.get(id) {
            return Some(p);
        }
        self.load_one(id).await.ok().flatten()
    }

    /// Look `id` up in the store (shared stores only); a live one joins the live map.
    async fn load_one(&self, id: &str) -> Result<Option<Arc<Principal>>, SessionError> {
        if !self.is_shared() || self.ended.contains_key(id) {
            return Ok(None);
        }
        let owned = id.to_owned();
        let now = now_ms() / 1000;
        let Some(row) = self.db.call(move |db| db.get_live(&owned, now)).await? else {
            self.ended.insert(id.to_owned(), ());
            return Ok(None);
        };
        let principal = Arc::new(principal_of(row));
        let mut live = self
            .live
            .write()
            .map_err(|e| StoreError::Task(e.to_string()))?;
        // Ended meanwhile (teardown news raced the lookup): stays ended.
        if self.ended.contains_key(id) {
            return Ok(None);
        }
        Ok(Some(
            live.entry(id.to_owned())
                .or_insert_with(|| principal)
                .clone(),
        ))
    }

    /// Bring every live descendant of `session` that another replica made into the live
    /// map, so that teardown reaches the whole tree (shared stores only).
    pub async fn load_tree(&self, session: &str) -> Result<(), SessionError> {
        if !self.is_shared() {
            return Ok(());
        }
        let now = now_ms() / 1000;
        let rows = self.db.call(move |db| db.live(now)).await?;
        let mut tree = std::collections::HashSet::from([session.to_owned()]);
        let mut found = Vec::new();
        // Parents before children is not guaranteed: sweep until nothing joins.
        let mut rest = rows;
        loop {
            let before = found.len();
            rest.retain(|row| {
                let joins = row.parent.as_ref().is_some_and(|p| tree.contains(p));
                if joins {
                    tree.insert(row.id.clone());
                    found.push(row.clone());
                }
                !joins
            });
            if found.len() == before {
                break;
            }
        }
        let mut live = self
            .live
            .write()
            .map_err(|e| StoreError::Task(e.to_string()))?;
        for row in found {
            if !self.ended.contains_key(&row.id) {
                live.entry(row.id.clone())
                    .or_insert_with(|| Arc::new(principal_of(row)));
            }
        }
        Ok(())
    }

    /// Forget sessions the store no longer holds live (ended on another replica whose news
    /// did not arrive): the reaper's backstop. Returns those taken out, for teardown.
    pub async fn reconcile(&self) -> Result<Vec<Arc<Principal>>, SessionError> {
        if !self.is_shared() {
            return Ok(Vec::new());
        }
        let now = now_ms() / 1000;
        let rows = self.db.call(move |db| db.live(now)).await?;
        let alive: std::collections::HashSet<String> = rows.into_iter().map(|r| r.id).collect();
        let mut live = self
            .live
            .write()
            .map_err(|e| StoreError::Task(e.to_string()))?;
        let gone: Vec<String> = live
            .keys()
            .filter(|id| !alive.contains(*id))
            .cloned()
            .collect();
        Ok(gone
            .iter()
            .filter_map(|id| {
                self.ended.insert(id.clone(), ());
                self.memory.forget(id);
                live.remove(id)
            })
            .collect())
    }

    /// Create a session and sign its token. A child (`parent` given, with the agent it runs
    /// as, settled by [`super::spawn::resolve`]) inherits its parent's tenant, is one level
    /// deeper, never outlives it, and counts against its parent's `max_children`.
    pub async fn create(
        &self,
        new: NewSession,
        parent: Option<(&Principal, &super::spawn::ChildAgent)>,
    ) -> Result<(Arc<Principal>, String), SessionError> {
        let agent = match (parent, new.agent.as_deref()) {
            (Some((_, child)), _) => child.name().to_owned(),
            (None, Some(agent)) => agent.to_owned(),
            (None, None) => return Err(SessionError::Invalid("agent is required".into())),
        };
        let parent = parent.map(|(p, _)| p);
        valid_name("agent", &agent)?;
        // A child cannot leave its parent's sandbox profile for a laxer one (its own
        // process may run elsewhere, but policy must not be told otherwise).
        let profile = match (parent, new.profile) {
            (Some(p), None) => p.profile.clone(),
            (Some(p), Some(named)) if p.profile.as_deref() == Some(named.as_str()) => Some(named),
            (Some(p), Some(named)) => {
                return Err(SessionError::Invalid(format!(
                    "a child session runs under its parent's sandbox profile ({}), not {named:?}",
                    p.profile.as_deref().unwrap_or("none")
                )))
            }
            (None, named) => named,
        };
        if let Some(name) = profile.as_deref().filter(|n| !valid_profile_name(n)) {
            return Err(SessionError::Invalid(format!(
                "profile {name:?}: a profile name is 1-64 characters of a-z 0-9 _ -"
            )));
        }
        let tenant = match (parent, new.tenant) {
            (Some(p), Some(t)) if t != p.tenant => {
                return Err(SessionError::Invalid(format!(
                    "a child session stays in its parent's tenant {:?}",
                    p.tenant
                )))
            }
            (Some(p), _) => p.tenant.clone(),
            (None, t) => t.unwrap_or_else(|| "default".to_owned()),
        };
        valid_name("tenant", &tenant)?;
        let ttl = match new.ttl.as_deref() {
            None => self.default_ttl,
            Some(text) => humantime::parse_duration(text)
                .map_err(|e| SessionError::Invalid(format!("ttl {text:?}: {e}")))?,
        };
        // Whole seconds: a sub-second ttl would make a session that is expired at birth.
        if ttl < Duration::from_secs(1) || ttl > self.max_ttl {
            return Err(SessionError::Invalid(format!(
                "ttl must be between 1s and {} (sessions.max_ttl)",
                humantime::format_duration(self.max_ttl)
            )));
        }
        let now = now_ms() / 1000;
        let mut expires_at = now + ttl.as_secs() as i64;
        let mut depth = 0;
        if let Some(parent) = parent {
            self.may_spawn(parent)?;
            depth = parent.depth + 1;
            expires_at = expires_at.min(parent.expires_at);
        }
        let principal = Arc::new(Principal {
            session_id: crate::ids::session_id(),
            agent,
            tenant,
            depth,
            expires_at,
            parent: parent.map(|p| p.session_id.clone()),
            parent_agent: parent.map(|p| p.agent.clone()),
            profile,
        });
        let token = self.keys.sign(&Claims {
            iss: ISSUER.into(),
            aud: AUDIENCE.into(),
            sub: principal.agent.clone(),
            exp: principal.expires_at,
            nbf: now,
            iat: now,
            jti: principal.session_id.clone(),
            ten: principal.tenant.clone(),
        })?;

        let row = principal.clone();
        let (max_calls, max_cost) = (new.max_calls.map(|c| c as i64), new.max_cost);
        let at_ms = now_ms();
        self.db
            .call(move |db| {
                // A child starts with its parent's labels (taint does not wash out by
                // spawning): given before the session exists, so it is never seen without.
                if let Some(parent) = &row.parent {
                    db.inherit_labels(parent, &row.session_id, at_ms)?;
                }
                db.insert(&NewSessionRow {
                    id: &row.session_id,
                    agent: &row.agent,
                    tenant: &row.tenant,
                    created_at: now,
                    expires_at: row.expires_at,
                    depth: row.depth,
                    parent: row.parent.as_deref(),
                    profile: row.profile.as_deref(),
                    max_calls,
                    max_cost,
                })
            })
            .await?;

        {
            let mut live = self
                .live
                .write()
                .map_err(|e| StoreError::Task(e.to_string()))?;
            // Expired sessions are refused on lookup and taken out by the reaper
            // ([`SessionRegistry::take_expired`]), which tears them down.
            live.insert(principal.session_id.clone(), principal.clone());
        }
        Ok((principal, token))
    }

    /// Take expired sessions out of the live map, for teardown: refused on lookup already,
    /// they still hold leases until someone ends them.
    pub fn take_expired(&self) -> Vec<Arc<Principal>> {
        let now = now_ms() / 1000;
        let Ok(mut live) = self.live.write() else {
            return Vec::new();
        };
        let expired: Vec<String> = live
            .iter()
            .filter(|(_, p)| p.expires_at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.memory.forget(id);
        }
        expired.iter().filter_map(|id| live.remove(id)).collect()
    }

    /// Whether `parent` may spawn one more child: depth and fan-out bounds
    /// (`sessions.max_depth`, `sessions.max_children`).
    pub fn may_spawn(&self, parent: &Principal) -> Result<(), SessionError> {
        let depth = parent.depth + 1;
        if depth > self.max_depth {
            return Err(SessionError::Bound {
                limit: "depth",
                used: u64::from(depth),
                max: u64::from(self.max_depth),
            });
        }
        let children = self.children(&parent.session_id).len();
        if children >= self.max_children as usize {
            return Err(SessionError::Bound {
                limit: "children",
                used: children as u64,
                max: u64::from(self.max_children),
            });
        }
        Ok(())
    }

    /// The live children of `session`.
    pub fn children(&self, session: &str) -> Vec<Arc<Principal>> {
        self.live
            .read()
            .map(|live| {
                live.values()
                    .filter(|p| p.parent.as_deref() == Some(session))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every live descendant of `session`, deepest first (the order teardown ends them in).
    pub fn descendants(&self, session: &str) -> Vec<Arc<Principal>> {
        let mut out = Vec::new();
        let mut frontier = vec![session.to_owned()];
        while let Some(id) = frontier.pop() {
            for child in self.children(&id) {
                frontier.push(child.session_id.clone());
                out.push(child);
            }
        }
        out.sort_by_key(|p| std::cmp::Reverse(p.depth));
        out
    }

    /// The live session `id`, if any.
    pub fn get(&self, session_id: &str) -> Option<Arc<Principal>> {
        self.live.read().ok()?.get(session_id).cloned()
    }

    /// Take a session another replica ended out of the live map; remembered as ended.
    pub fn forget_ended(&self, session_id: &str) {
        self.ended.insert(session_id.to_owned(), ());
        self.memory.forget(session_id);
        if let Ok(mut live) = self.live.write() {
            live.remove(session_id);
        }
        let id = session_id.to_owned();
        let _ = self
            .verified
            .invalidate_entries_if(move |_, p| p.session_id == id);
    }

    /// Tear a session down. Returns false when it was not live. Idempotent.
    pub async fn revoke(&self, session_id: &str) -> Result<bool, SessionError> {
        self.ended.insert(session_id.to_owned(), ());
        self.memory.forget(session_id);
        let removed = self
            .live
            .write()
            .map_err(|e| StoreError::Task(e.to_string()))?
            .remove(session_id)
            .is_some();
        // Cached verifications of its token are refused by the live check; drop them anyway.
        let id = session_id.to_owned();
        self.verified
            .invalidate_entries_if(move |_, p| p.session_id == id)
            .map_err(|e| StoreError::Task(e.to_string()))?;
        let id = session_id.to_owned();
        self.db
            .call(move |db| db.revoke(&id, now_ms() / 1000))
            .await?;
        Ok(removed)
    }

    /// The principal a token stands for, if its signature, claims and session are valid.
    pub async fn authenticate(&self, token: &str) -> Result<Arc<Principal>, SessionError> {
        let now = now_ms() / 1000;
        let principal = match self.verified.get(token) {
            Some(p) => p,
            None => {
                let claims = self.keys.verify(token)?;
                // Only a token whose signature verified may cost a lookup in the store.
                let p = match self.lookup(&claims.jti) {
                    Ok(p) => p,
                    Err(e) => self.load_one(&claims.jti).await?.ok_or(e)?,
                };
                if p.agent != claims.sub || p.tenant != claims.ten {
                    return Err(SessionError::Invalid(
                        "token claims do not match the session".into(),
                    ));
                }
                self.verified.insert(token.to_owned(), p.clone());
                p
            }
        };
        // Checked on every request, cached or not: teardown and expiry take effect at once.
        if principal.expires_at <= now {
            return Err(SessionError::NotActive(principal.session_id.clone()));
        }
        self.lookup(&principal.session_id)
    }

    /// Whether a session is still live (for requests inside an already authenticated tunnel).
    pub fn is_live(&self, session_id: &str) -> bool {
        let now = now_ms() / 1000;
        self.live
            .read()
            .map(|l| l.get(session_id).is_some_and(|p| p.expires_at > now))
            .unwrap_or(false)
    }

    fn lookup(&self, session_id: &str) -> Result<Arc<Principal>, SessionError> {
        self.live
            .read()
            .map_err(|e| StoreError::Task(e.to_string()))?
            .get(session_id)
            .cloned()
            .ok_or_else(|| SessionError::NotActive(session_id.to_owned()))
    }
}
