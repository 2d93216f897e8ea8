//! The egress guard (Stripe's smokescreen is the reference): where the proxy may connect.
//!
//! Resolve once, check every resolved address, dial exactly an address that was checked.
//! Lookups go through a short-lived cache that coalesces concurrent lookups, so the
//! CONNECT-time check and the later dial of the same tunnel see one answer: a rebinding DNS
//! server gets exactly one question. The resolver and the dialer are traits so that tests
//! can answer with any address and record dials instead of sending packets.
//!
//! - [`address`] — host normalisation and the classification of addresses.

pub mod address;

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::TcpStream;

pub use address::Host;

/// A boxed future, for the object-safe traits below.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Name resolution. The system resolver in production; stubs in tests.
pub trait Resolve: Send + Sync + fmt::Debug {
    /// All addresses of `host` (a canonical DNS name, never an IP literal).
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>>;
}

/// Opening TCP connections. Real sockets in production; recording dialers in tests.
pub trait Dial: Send + Sync + fmt::Debug {
    /// Connect to exactly `addr`.
    fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<TcpStream>>;
}

/// The operating system's resolver (getaddrinfo on a blocking thread).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn lookup<'a>(&'a self, host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, 0)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// Plain TCP connections.
#[derive(Debug, Default, Clone, Copy)]
pub struct TcpDialer;

impl Dial for TcpDialer {
    fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<TcpStream>> {
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            Ok(stream)
        })
    }
}

/// Why a destination could not be reached.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EgressError {
    #[error("{address} is blocked ({reason})")]
    Blocked { address: String, reason: String },
    #[error("resolving {host}: {message}")]
    Resolve { host: String, message: String },
    #[error("{host} has no address")]
    NoAddress { host: String },
    #[error("connecting to {address}: {message}")]
    Connect { address: String, message: String },
    #[error("connecting to {address} timed out")]
    Timeout { address: String },
}

/// How long a lookup answer is reused, whatever TTL the DNS server gave. Long enough that a
/// tunnel's check and its dials see one answer; short enough to follow real changes.
const RESOLVE_CACHE_TTL: Duration = Duration::from_secs(30);

/// The cache of lookups, each answer kept `ttl`.
fn resolve_cache(ttl: Duration) -> moka::future::Cache<String, Arc<Vec<IpAddr>>> {
    moka::future::Cache::builder()
        .max_capacity(10_000)
        .time_to_live(ttl)
        .build()
}

/// The guard itself.
pub struct Guard {
    resolver: Arc<dyn Resolve>,
    dialer: Arc<dyn Dial>,
    static_map: BTreeMap<String, IpAddr>,
    allow_private: Vec<ipnet::IpNet>,
    /// The proxy's own listeners, filled in once they are bound; never reachable.
    own: RwLock<Vec<SocketAddr>>,
    cache: moka::future::Cache<String, Arc<Vec<IpAddr>>>,
    connect_timeout: Duration,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("resolver", &self.resolver)
            .field("dialer", &self.dialer)
            .field("allow_private", &self.allow_private)
            .finish_non_exhaustive()
    }
}

impl Guard {
    /// Build a guard.
    pub fn new(
        resolver: Arc<dyn Resolve>,
        dialer: Arc<dyn Dial>,
        static_map: BTreeMap<String, IpAddr>,
        allow_private: Vec<ipnet::IpNet>,
        connect_timeout: Duration,
    ) -> Self {
        let static_map = static_map
            .into_iter()
            .map(|(k, v)| (k.trim_end_matches('.').to_ascii_lowercase(), v))
            .collect();
        Self {
            resolver,
            dialer,
            static_map,
            allow_private,
            own: RwLock::new(Vec::new()),
            cache: resolve_cache(RESOLVE_CACHE_TTL),
            connect_timeout,
        }
    }

    /// The guard with its lookups cached for `ttl` (tests: the cache's expiry in
    /// milliseconds, not [`RESOLVE_CACHE_TTL`]).
    #[cfg(test)]
    fn with_cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache = resolve_cache(ttl);
        self
    }

    /// Record the proxy's own bound listeners.
    pub fn set_own_listeners(&self, addrs: Vec<SocketAddr>) {
        if let Ok(mut own) = self.own.write() {
            *own = addrs;
        }
    }

    /// Resolve `host` and check every address; the checked socket addresses, in order.
    pub async fn resolve(&self, host: &Host, port: u16) -> Result<Vec<SocketAddr>, EgressError> {
        let ips = match host {
            Host::Ip(ip) => Arc::new(vec![*ip]),
            Host::Name(name) => self.lookup(name).await?,
        };
        if ips.is_empty() {
            return Err(EgressError::NoAddress {
                host: host.to_string(),
            });
        }
        let own = self.own.read().map(|o| o.clone()).unwrap_or_default();
        let mut out = Vec::with_capacity(ips.len());
        // Every address is checked, not just the one dialed first: a mixed answer is a
        // rebinding attempt, and refusing it whole keeps the rule simple and closed.
        for ip in ips.iter() {
            let addr = SocketAddr::new(*ip, port);
            if address::is_own_listener(addr, &own) {
                return Err(EgressError::Blocked {
                    address: addr.to_string(),
                    reason: "the proxy's own listener".into(),
                });
            }
            address::check_ip(*ip, &self.allow_private).map_err(|b| EgressError::Blocked {
                address: ip.to_string(),
                reason: b.reason.as_str().to_owned(),
            })?;
            out.push(addr);
        }
        Ok(out)
    }

    /// Resolve, check, and dial the first checked address that answers.
    pub async fn connect(
        &self,
        host: &Host,
        port: u16,
    ) -> Result<(TcpStream, SocketAddr), EgressError> {
        let addrs = self.resolve(host, port).await?;
        self.dial_checked(&addrs).await
    }

    /// Dial addresses returned by [`Guard::resolve`], in order.
    pub async fn dial_checked(
        &self,
        addrs: &[SocketAddr],
    ) -> Result<(TcpStream, SocketAddr), EgressError> {
        let mut last = None;
        for addr in addrs {
            match tokio::time::timeout(self.connect_timeout, self.dialer.dial(*addr)).await {
                Ok(Ok(stream)) => return Ok((stream, *addr)),
                Ok(Err(e)) => {
                    last = Some(EgressError::Connect {
                        address: addr.to_string(),
                        message: e.to_string(),
                    })
                }
                Err(_) => {
                    last = Some(EgressError::Timeout {
                        address: addr.to_string(),
                    })
                }
            }
        }
        Err(last.unwrap_or(EgressError::NoAddress {
            host: "(none)".into(),
        }))
    }

    async fn lookup(&self, name: &str) -> Result<Arc<Vec<IpAddr>>, EgressError> {
        if let Some(ip) = self.static_map.get(name) {
            return Ok(Arc::new(vec![*ip]));
        }
        let resolver = self.resolver.clone();
        let key = name.to_owned();
        self.cache
            .try_get_with(key.clone(), async move {
                resolver.lookup(&key).await.map(Arc::new)
            })
            .await
            .map_err(|e: Arc<io::Error>| EgressError::Resolve {
                host: name.to_owned(),
                message: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Answers each lookup with the next of its answers (the last one again when out).
    #[derive(Debug)]
    struct Rebinding {
        answers: Mutex<Vec<Vec<IpAddr>>>,
        asked: Mutex<usize>,
    }

    impl Resolve for Rebinding {
        fn lookup<'a>(&'a self, _host: &'a str) -> BoxFuture<'a, io::Result<Vec<IpAddr>>> {
            let mut answers = self.answers.lock().unwrap();
            *self.asked.lock().unwrap() += 1;
            let answer = if answers.len() > 1 {
                answers.remove(0)
            } else {
                answers[0].clone()
            };
            Box::pin(async move { Ok(answer) })
        }
    }

    /// Dials nothing: these tests only resolve.
    #[derive(Debug)]
    struct NoDial;

    impl Dial for NoDial {
        fn dial(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<TcpStream>> {
            Box::pin(async move { panic!("no test here dials, {addr} was asked") })
        }
    }

    #[tokio::test]
    async fn a_name_that_rebinds_once_its_cached_answer_expires_is_checked_again() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let resolver = Arc::new(Rebinding {
            answers: Mutex::new(vec![vec![ip("127.0.0.1")], vec![ip("10.0.0.1")]]),
            asked: Mutex::new(0),
        });
        let guard = Guard::new(
            resolver.clone(),
            Arc::new(NoDial),
            BTreeMap::new(),
            vec!["127.0.0.1/32".parse().unwrap()],
            Duration::from_secs(1),
        )
        .with_cache_ttl(Duration::from_millis(50));
        let host = Host::Name("rebind.test".into());
        let first = guard.resolve(&host, 443).await.unwrap();
        assert_eq!(first, [SocketAddr::new(ip("127.0.0.1"), 443)]);
        // Within the cache's life: the one answer again, no second question.
        assert_eq!(guard.resolve(&host, 443).await.unwrap(), first);
        assert_eq!(*resolver.asked.lock().unwrap(), 1);
        // After it (TTL 0 answers rebinding to a private address): asked again, and the new
        // answer is checked like the first, not trusted for the name's sake.
        tokio::time::sleep(Duration::from_millis(120)).await;
        match guard.resolve(&host, 443).await {
            Err(EgressError::Blocked { address, .. }) => assert_eq!(address, "10.0.0.1"),
            other => panic!("the rebound answer passed: {other:?}"),
        }
        assert_eq!(*resolver.asked.lock().unwrap(), 2);
    }

    #[tokio::test]
    async fn an_answer_mixing_an_allowed_and_a_private_address_is_refused_whole() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let resolver = Arc::new(Rebinding {
            answers: Mutex::new(vec![vec![ip("127.0.0.1"), ip("169.254.169.254")]]),
            asked: Mutex::new(0),
        });
        let guard = Guard::new(
            resolver,
            Arc::new(NoDial),
            BTreeMap::new(),
            vec!["127.0.0.1/32".parse().unwrap()],
            Duration::from_secs(1),
        );
        let refused = guard.resolve(&Host::Name("mixed.test".into()), 443).await;
        assert!(
            matches!(&refused, Err(EgressError::Blocked { address, .. }) if address == "169.254.169.254"),
            "{refused:?}"
        );
    }
}
