//! Destination addresses for the egress (SSRF) guard: what a host *is*, and whether an IP may
//! be dialed.
//!
//! Policies decide on the canonical host text, and the dialer checks the IP it is about to
//! connect to. Both must see one spelling per destination: if `0x7f.1`, `2130706433` and
//! `127.0.0.1` were three entity ids, a `forbid` on one would be bypassed by the others, and if
//! `::ffff:10.0.0.1` were judged as "some IPv6 address" the RFC 1918 block would be bypassed.
//! So hosts are normalised with the WHATWG parser that browsers and curl follow, and IPv6 forms
//! that carry an IPv4 address are judged by the IPv4 address they lead to.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A destination host as policies see it. `Display` is the canonical text (the Cedar entity id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A lowercase ASCII (punycode) DNS name without trailing dot.
    Name(String),
    /// An IP literal. IPv4-mapped IPv6 literals are stored as their IPv4 address.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why a host or authority sent by the agent was refused (a 400, never a dial).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("empty host")]
    Empty,
    #[error("host contains userinfo ('@')")]
    UserInfo,
    #[error("host contains whitespace or control characters")]
    Whitespace,
    #[error("host is {0} characters long (at most 253)")]
    TooLong(usize),
    #[error("host has an empty label")]
    EmptyLabel,
    #[error("host has a label longer than 63 characters")]
    LabelTooLong,
    #[error("host contains a character not allowed in a DNS name")]
    ForbiddenChar,
    #[error("invalid host: {0}")]
    Invalid(url::ParseError),
    #[error("IPv6 literal must be bracketed in an authority")]
    UnbracketedIpv6,
    #[error("malformed bracketed IPv6 literal")]
    MalformedBrackets,
    #[error("empty port")]
    EmptyPort,
    #[error("port is not a decimal number")]
    InvalidPort,
    #[error("port 0 is not a destination")]
    PortZero,
    #[error("port is larger than 65535")]
    PortOutOfRange,
}

const MAX_HOST_LEN: usize = 253;
// Percent-escapes and IDN can make a raw host several times longer than its canonical form;
// anything beyond this cannot normalise to 253 characters, so don't spend IDNA work on it.
const MAX_RAW_LEN: usize = 4 * 1024;

/// Normalises the host part (no port) of a CONNECT authority, absolute URI or `Host` header.
pub fn normalize_host(raw: &str) -> Result<Host, HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    if raw.len() > MAX_RAW_LEN {
        return Err(HostError::TooLong(raw.len()));
    }
    // url would reject these too, but as a generic IDNA error; these are the ones worth naming.
    if raw.contains('@') {
        return Err(HostError::UserInfo);
    }
    if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(HostError::Whitespace);
    }
    // Some callers hand over an IPv6 literal without brackets; give it the same parser.
    let parsed = if raw.contains(':') && !raw.starts_with('[') {
        url::Host::parse(&format!("[{raw}]"))
    } else {
        url::Host::parse(raw)
    };
    match parsed.map_err(|e| match e {
        url::ParseError::EmptyHost => HostError::Empty,
        other => HostError::Invalid(other),
    })? {
        url::Host::Ipv4(v4) => Ok(Host::Ip(IpAddr::V4(v4))),
        // ::ffff:a.b.c.d reaches a.b.c.d, so it must be the same entity as a.b.c.d.
        url::Host::Ipv6(v6) => Ok(Host::Ip(IpAddr::V6(v6).to_canonical())),
        url::Host::Domain(name) => normalize_name(name),
    }
}

fn normalize_name(mut name: String) -> Result<Host, HostError> {
    // The root label is implied; `example.com.` and `example.com` are one destination.
    if name.ends_with('.') {
        name.pop();
    }
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if name.len() > MAX_HOST_LEN {
        return Err(HostError::TooLong(name.len()));
    }
    // WHATWG lets through `*`, quotes, `;`, `{` and more; none names a real host, and each is a
    // way to confuse a log line, a header or a wildcard DNS lookup.
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
    {
        return Err(HostError::ForbiddenChar);
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(HostError::EmptyLabel);
        }
        if label.len() > 63 {
            return Err(HostError::LabelTooLong);
        }
    }
    Ok(Host::Name(name))
}

/// Splits `host`, `host:port`, `[v6]` or `[v6]:port` and normalises the host.
pub fn split_authority(authority: &str) -> Result<(Host, Option<u16>), HostError> {
    if authority.is_empty() {
        return Err(HostError::Empty);
    }
    // Checked first: in `user:pw@host:80` the userinfo colon would otherwise read as IPv6.
    if authority.contains('@') {
        return Err(HostError::UserInfo);
    }
    let (host, port) = if authority.starts_with('[') {
        let close = authority.find(']').ok_or(HostError::MalformedBrackets)?;
        let (host, rest) = authority.split_at(close + 1);
        match rest {
            "" => (host, None),
            _ => (
                host,
                Some(rest.strip_prefix(':').ok_or(HostError::MalformedBrackets)?),
            ),
        }
    } else {
        match authority.split_once(':') {
            None => (authority, None),
            Some((_, port)) if port.contains(':') => return Err(HostError::UnbracketedIpv6),
            Some((host, port)) => (host, Some(port)),
        }
    };
    let port = port.map(parse_port).transpose()?;
    Ok((normalize_host(host)?, port))
}

fn parse_port(text: &str) -> Result<u16, HostError> {
    if text.is_empty() {
        return Err(HostError::EmptyPort);
    }
    // u16::from_str accepts a leading `+`; an authority port is digits only.
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HostError::InvalidPort);
    }
    match text.trim_start_matches('0') {
        "" => Err(HostError::PortZero),
        digits => digits.parse().map_err(|_| HostError::PortOutOfRange),
    }
}

// One list gives each reason its variant and its stable name, so the two cannot drift apart.
macro_rules! block_reasons {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// Why an address may not be dialed. `as_str` is the stable name used in audit and metrics.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum BlockReason { $($variant),* }

        impl BlockReason {
            /// Every reason, e.g. to pre-register metric labels.
            pub const ALL: &'static [BlockReason] = &[$(BlockReason::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self { $(BlockReason::$variant => $name),* }
            }
        }
    };
}

block_reasons! {
    Unspecified => "unspecified", Loopback => "loopback", Private => "private", Cgnat => "cgnat",
    LinkLocal => "link_local", Reserved => "reserved", Documentation => "documentation",
    Benchmarking => "benchmarking", Multicast => "multicast", Broadcast => "broadcast",
    Ipv4Compatible => "ipv4_compatible", Teredo => "teredo", Discard => "discard",
    UniqueLocal => "unique_local", SiteLocal => "site_local",
}

impl fmt::Display for BlockReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An address the guard refuses to dial. For IPv6 forms that lead to an IPv4 address
/// (mapped, NAT64, 6to4, ISATAP), `reason` classifies that IPv4 address, which is in
/// `embedded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("destination {addr} is blocked: {reason}{}", embedded_note(.embedded))]
pub struct Blocked {
    pub addr: IpAddr,
    pub reason: BlockReason,
    pub embedded: Option<Ipv4Addr>,
}

fn embedded_note(embedded: &Option<Ipv4Addr>) -> String {
    embedded.map_or_else(String::new, |v4| format!(" (embedded IPv4 {v4})"))
}

const fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    Ipv4Net::new_assert(Ipv4Addr::new(a, b, c, d), len)
}

// Most IPv6 ranges here are set by their first two segments.
const fn v6([a, b]: [u16; 2], len: u8) -> Ipv6Net {
    Ipv6Net::new_assert(Ipv6Addr::new(a, b, 0, 0, 0, 0, 0, 0), len)
}

// Broadcast precedes 240/4, which contains it; otherwise the ranges are disjoint.
const V4_BLOCKED: &[(Ipv4Net, BlockReason)] = &[
    (v4(255, 255, 255, 255, 32), BlockReason::Broadcast),
    // Linux routes 0.0.0.0 (and so the whole "this network" block) to the local host.
    (v4(0, 0, 0, 0, 8), BlockReason::Unspecified),
    (v4(10, 0, 0, 0, 8), BlockReason::Private),
    (v4(100, 64, 0, 0, 10), BlockReason::Cgnat),
    (v4(127, 0, 0, 0, 8), BlockReason::Loopback),
    (v4(169, 254, 0, 0, 16), BlockReason::LinkLocal),
    (v4(172, 16, 0, 0, 12), BlockReason::Private),
    (v4(192, 0, 0, 0, 24), BlockReason::Reserved),
    (v4(192, 0, 2, 0, 24), BlockReason::Documentation),
    (v4(192, 88, 99, 0, 24), BlockReason::Reserved),
    (v4(192, 168, 0, 0, 16), BlockReason::Private),
    (v4(198, 18, 0, 0, 15), BlockReason::Benchmarking),
    (v4(198, 51, 100, 0, 24), BlockReason::Documentation),
    (v4(203, 0, 113, 0, 24), BlockReason::Documentation),
    (v4(224, 0, 0, 0, 4), BlockReason::Multicast),
    (v4(240, 0, 0, 0, 4), BlockReason::Reserved),
];

// ::, ::1 and the forms carrying IPv4 are handled before this table is consulted.
const V6_BLOCKED: &[(Ipv6Net, BlockReason)] = &[
    (v6([0, 0], 96), BlockReason::Ipv4Compatible),
    (v6([0x2001, 0], 32), BlockReason::Teredo),
    (v6([0x2001, 2], 48), BlockReason::Benchmarking),
    (v6([0x2001, 0xdb8], 32), BlockReason::Documentation),
    (v6([0x3fff, 0], 20), BlockReason::Documentation),
    (v6([0x100, 0], 64), BlockReason::Discard),
    (v6([0xfc00, 0], 7), BlockReason::UniqueLocal),
    (v6([0xfe80, 0], 10), BlockReason::LinkLocal),
    (v6([0xfec0, 0], 10), BlockReason::SiteLocal),
    (v6([0xff00, 0], 8), BlockReason::Multicast),
];

const V4_MAPPED: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), 96);
const NAT64_WELL_KNOWN: Ipv6Net = v6([0x64, 0xff9b], 96);
// RFC 8215 local-use prefix. Inside it an operator's translator may use any RFC 6052 layout
// (prefix /48, /56, /64 or /96), and which one cannot be known here: see `nat64_local`.
const NAT64_LOCAL: Ipv6Net = Ipv6Net::new_assert(Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0), 48);
const SIX_TO_FOUR: Ipv6Net = v6([0x2002, 0], 16);
// All globally routable unicast space IANA has allocated lies here; the rest is unassigned or
// special, and an address nobody can route publicly has no business being dialed.
const GLOBAL_UNICAST: Ipv6Net = v6([0x2000, 0], 3);

enum Class {
    Public,
    Blocked(BlockReason),
    /// Leads (or may lead, depending on a translator's layout) to each of these IPv4
    /// addresses; every one of them must be allowed.
    Embeds(Embedded),
}

/// Up to four IPv4 addresses one IPv6 address can stand for.
#[derive(Default)]
struct Embedded {
    addrs: [Option<Ipv4Addr>; 4],
}

impl Embedded {
    fn one(v4: Ipv4Addr) -> Self {
        let mut e = Self::default();
        e.push(v4);
        e
    }

    fn push(&mut self, v4: Ipv4Addr) {
        if let Some(slot) = self.addrs.iter_mut().find(|a| a.is_none()) {
            *slot = Some(v4);
        }
    }

    fn iter(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.addrs.iter().flatten().copied()
    }
}

/// The IPv4 addresses an address in 64:ff9b:1::/48 may be translated to. RFC 6052 §2.2 puts
/// the IPv4 address at a place set by the translator's prefix length, skipping bits 64–71
/// (the "u" octet, zero); what follows it (the suffix) is zero as DNS64 writes it. Each
/// layout whose u octet and suffix are zero is a reading a translator could make, and the
/// /96 one (the last 32 bits) always is: the address is dialed only if every reading is.
fn nat64_local(o: &[u8; 16]) -> Embedded {
    let v4 = |a: u8, b: u8, c: u8, d: u8| Ipv4Addr::new(a, b, c, d);
    let zero = |bytes: &[u8]| bytes.iter().all(|&b| b == 0);
    let mut e = Embedded::default();
    if o[8] == 0 {
        if zero(&o[11..]) {
            e.push(v4(o[6], o[7], o[9], o[10])); // /48
        }
        if zero(&o[12..]) {
            e.push(v4(o[7], o[9], o[10], o[11])); // /56
        }
        if zero(&o[13..]) {
            e.push(v4(o[9], o[10], o[11], o[12])); // /64
        }
    }
    e.push(v4(o[12], o[13], o[14], o[15])); // /96
    e
}

/// The IPv4 address in an ISATAP interface identifier (RFC 5214: `[0 or 2]00:5efe:a.b.c.d`,
/// u/g bits aside): a host with an ISATAP interface delivers to it over IPv4.
fn isatap(o: &[u8; 16]) -> Option<Ipv4Addr> {
    ((o[8] & !0x03) == 0 && o[9..12] == [0x00, 0x5e, 0xfe])
        .then(|| Ipv4Addr::new(o[12], o[13], o[14], o[15]))
}

fn classify_v4(ip: Ipv4Addr) -> Option<BlockReason> {
    V4_BLOCKED
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .map(|&(_, reason)| reason)
}

fn classify_v6(ip: Ipv6Addr) -> Class {
    let o = ip.octets();
    if ip.is_unspecified() {
        Class::Blocked(BlockReason::Unspecified)
    } else if ip.is_loopback() {
        Class::Blocked(BlockReason::Loopback)
    } else if V4_MAPPED.contains(&ip) || NAT64_WELL_KNOWN.contains(&ip) {
        Class::Embeds(Embedded::one(Ipv4Addr::new(o[12], o[13], o[14], o[15])))
    } else if NAT64_LOCAL.contains(&ip) {
        Class::Embeds(nat64_local(&o))
    } else if SIX_TO_FOUR.contains(&ip) {
        Class::Embeds(Embedded::one(Ipv4Addr::new(o[2], o[3], o[4], o[5])))
    } else if let Some(&(_, reason)) = V6_BLOCKED.iter().find(|(net, _)| net.contains(&ip)) {
        // Teredo (2001::/32) among them: its client address is XOR-obfuscated in the last 32
        // bits and its server's in bits 32–63; the whole prefix is refused, decoded or not.
        Class::Blocked(reason)
    } else if !GLOBAL_UNICAST.contains(&ip) {
        Class::Blocked(BlockReason::Reserved)
    } else if let Some(v4) = isatap(&o) {
        Class::Embeds(Embedded::one(v4))
    } else {
        Class::Public
    }
}

/// Decides whether `ip` may be dialed. `allow_private` exempts addresses it contains, and, for
/// IPv6 forms leading to an IPv4 address, the forms whose IPv4 address it contains. It never
/// covers the proxy's own listeners: check those with [`is_own_listener`].
pub fn check_ip(ip: IpAddr, allow_private: &[IpNet]) -> Result<(), Blocked> {
    let exempt = |addr: IpAddr| allow_private.iter().any(|net| net.contains(&addr));
    if exempt(ip) {
        return Ok(());
    }
    let class = match ip {
        IpAddr::V4(v4) => classify_v4(v4).map_or(Class::Public, Class::Blocked),
        IpAddr::V6(v6) => classify_v6(v6),
    };
    let blocked = |reason, embedded| {
        Err(Blocked {
            addr: ip,
            reason,
            embedded,
        })
    };
    match class {
        Class::Public => Ok(()),
        Class::Blocked(reason) => blocked(reason, None),
        Class::Embeds(inner) => {
            for v4 in inner.iter() {
                match classify_v4(v4) {
                    None => {}
                    Some(_) if exempt(IpAddr::V4(v4)) => {}
                    Some(reason) => return blocked(reason, Some(v4)),
                }
            }
            Ok(())
        }
    }
}

/// True when dialing `addr` would reach one of the proxy's own listeners, which would let an
/// agent talk to the control API or loop the proxy into itself. Addresses the host owns on
/// other interfaces are not known here; a listener on `0.0.0.0`/`::` relies on those being
/// private (and so blocked) unless `allow_private` says otherwise.
pub fn is_own_listener(addr: SocketAddr, listeners: &[SocketAddr]) -> bool {
    // ::ffff:127.0.0.1 reaches a socket bound to 127.0.0.1, so compare canonical forms. Any
    // loopback address or a dial to 0.0.0.0/:: lands on this host, whichever local address the
    // listener is bound to, so "local" matches "local" across families.
    let local = |ip: IpAddr| ip.is_loopback() || ip.is_unspecified();
    let ip = addr.ip().to_canonical();
    listeners.iter().any(|listener| {
        let own = listener.ip().to_canonical();
        listener.port() == addr.port() && (own == ip || (local(own) && local(ip)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use url::ParseError::{IdnaError, InvalidIpv4Address, InvalidIpv6Address};
    use HostError as E;

    fn items(table: &str) -> impl Iterator<Item = (&str, &str)> {
        table
            .split_whitespace()
            .map(|item| item.rsplit_once('=').expect(item))
    }

    /// Items `raw=canonical`; a canonical text that parses as an IP must come back as `Host::Ip`.
    fn normalizes(table: &str) {
        for (raw, want) in items(table) {
            let want = want
                .parse()
                .map_or_else(|_| Host::Name(want.into()), Host::Ip);
            assert_eq!(normalize_host(raw), Ok(want.clone()), "{raw}");
            assert_eq!(normalize_host(raw).unwrap().to_string(), want.to_string());
        }
    }

    /// Items `addr=ok` or `addr=reason` or `addr=reason@embedded-ipv4`.
    fn checks(allow: &[&str], table: &str) {
        let allow: Vec<IpNet> = allow.iter().map(|n| n.parse().unwrap()).collect();
        for (addr, want) in items(table) {
            let ip: IpAddr = addr.parse().unwrap();
            let expected = match want.split_once('@').unwrap_or((want, "")) {
                ("ok", _) => Ok(()),
                (name, embedded) => Err(Blocked {
                    addr: ip,
                    reason: *BlockReason::ALL
                        .iter()
                        .find(|r| r.as_str() == name)
                        .expect(name),
                    embedded: (!embedded.is_empty()).then(|| embedded.parse().unwrap()),
                }),
            };
            assert_eq!(check_ip(ip, &allow), expected, "{addr} allow {allow:?}");
        }
    }

    /// Items `addr=yes` or `addr=no` against the listeners given.
    fn own(listeners: &[&str], table: &str) {
        let listeners: Vec<SocketAddr> = listeners.iter().map(|l| l.parse().unwrap()).collect();
        for (addr, want) in items(table) {
            let want = match want {
                "yes" => true,
                "no" => false,
                _ => panic!("{want}"),
            };
            let got = is_own_listener(addr.parse().unwrap(), &listeners);
            assert_eq!(got, want, "{addr} vs {listeners:?}");
        }
    }

    #[test]
    fn odd_ipv4_spellings_normalise_like_browsers() {
        normalizes(
            "2130706433=127.0.0.1 0x7f.1=127.0.0.1 127.1=127.0.0.1 0177.0.0.1=127.0.0.1
             0x7f000001=127.0.0.1 0X7F.0x1=127.0.0.1 127.0.0.1.=127.0.0.1 %31%32%37.1=127.0.0.1
             １２７.０.０.１=127.0.0.1 0=0.0.0.0 4294967295=255.255.255.255 10.1=10.0.0.1",
        );
    }

    #[test]
    fn names_are_lowercased_punycoded_and_lose_one_trailing_dot() {
        normalizes(
            "EXAMPLE.Com=example.com example.com.=example.com example.com。=example.com
             bücher.example=xn--bcher-kva.example BÜCHER.example.=xn--bcher-kva.example
             XN--BCHER-KVA.example=xn--bcher-kva.example %41pi.example=api.example
             under_score.example=under_score.example 1.2.3.4.example=1.2.3.4.example",
        );
        let ok_253 = ["a", "b", "c"].map(|c| c.repeat(63)).join(".") + "." + &"d".repeat(61);
        assert_eq!(normalize_host(&ok_253), Ok(Host::Name(ok_253.clone())));
        assert_eq!(
            normalize_host(&format!("{ok_253}.")),
            Ok(Host::Name(ok_253.clone()))
        );
        assert_eq!(normalize_host(&format!("{ok_253}a")), Err(E::TooLong(254)));
        assert_eq!(normalize_host(&"x".repeat(5000)), Err(E::TooLong(5000)));
        let long_label = format!("{}.example", "a".repeat(64));
        assert_eq!(normalize_host(&long_label), Err(E::LabelTooLong));
    }

    #[test]
    fn ipv6_literals_bracketed_or_not_and_mapped_ones_as_ipv4() {
        normalizes(
            "[::1]=::1 ::1=::1 [2001:DB8:0:0::1]=2001:db8::1 [::FFFF:7F00:1]=127.0.0.1
             [::ffff:10.0.0.1]=10.0.0.1 [64:ff9b::10.0.0.1]=64:ff9b::a00:1 [::127.0.0.1]=::7f00:1",
        );
    }

    #[test]
    #[rustfmt::skip]
    fn malformed_hosts_are_errors() {
        for (raw, err) in [
            ("", E::Empty), (".", E::Empty), ("\u{200b}", E::Empty),
            ("user@example.com", E::UserInfo), ("exa mple.com", E::Whitespace),
            (" example.com", E::Whitespace), ("example.com\t", E::Whitespace), ("a\nb", E::Whitespace),
            ("a%20b", E::Invalid(IdnaError)), ("a%2fb", E::Invalid(IdnaError)),
            ("%40evil.example", E::Invalid(IdnaError)), ("a%00b", E::Invalid(IdnaError)),
            ("xn--zz", E::Invalid(IdnaError)), ("*.example", E::ForbiddenChar),
            ("a\"b.example", E::ForbiddenChar), ("a;b", E::ForbiddenChar),
            ("example.com..", E::EmptyLabel), (".example.com", E::EmptyLabel),
            ("example..com", E::EmptyLabel), ("1.2.3.4.5", E::Invalid(InvalidIpv4Address)),
            ("999999999999", E::Invalid(InvalidIpv4Address)),
            ("1.2.3.256", E::Invalid(InvalidIpv4Address)),
            ("[fe80::1%25eth0]", E::Invalid(InvalidIpv6Address)),
            ("[example.com]", E::Invalid(InvalidIpv6Address)), ("[::1", E::Invalid(InvalidIpv6Address)),
        ] {
            assert_eq!(normalize_host(raw), Err(err), "{raw:?}");
        }
    }

    #[test]
    #[rustfmt::skip]
    fn authorities_split_into_host_and_port() {
        for (authority, host, port) in [
            ("example.com:443", "example.com", Some(443)), ("example.com", "example.com", None),
            ("EXAMPLE.com.:0443", "example.com", Some(443)), ("127.1:65535", "127.0.0.1", Some(65535)),
            ("[::1]:8080", "::1", Some(8080)), ("[::1]", "::1", None),
            ("[::ffff:a00:1]:1", "10.0.0.1", Some(1)),
        ] {
            let want = (normalize_host(host).unwrap(), port);
            assert_eq!(split_authority(authority), Ok(want), "{authority}");
        }
        for (authority, err) in [
            ("", E::Empty), (":80", E::Empty), ("example.com:", E::EmptyPort),
            ("[::1]:", E::EmptyPort), ("example.com:0", E::PortZero), ("example.com:000", E::PortZero),
            ("example.com:65536", E::PortOutOfRange),
            ("example.com:99999999999999999999", E::PortOutOfRange),
            ("example.com:+80", E::InvalidPort), ("example.com:-1", E::InvalidPort),
            ("example.com:http", E::InvalidPort), ("example.com: 80", E::InvalidPort),
            ("example.com:0x50", E::InvalidPort), ("::1:80", E::UnbracketedIpv6),
            ("[::1", E::MalformedBrackets), ("[::1]80", E::MalformedBrackets),
            ("[::1]]:80", E::MalformedBrackets), ("user:pw@example.com:80", E::UserInfo),
            ("a b:80", E::Whitespace),
        ] {
            assert_eq!(split_authority(authority), Err(err), "{authority:?}");
        }
    }

    #[test]
    fn ipv4_ranges_block_inside_and_pass_just_outside() {
        checks(
            &[],
            "
            0.0.0.0=unspecified 0.255.255.255=unspecified 1.0.0.0=ok
            9.255.255.255=ok 10.0.0.0=private 10.255.255.255=private 11.0.0.0=ok
            100.63.255.255=ok 100.64.0.0=cgnat 100.127.255.255=cgnat 100.128.0.0=ok
            126.255.255.255=ok 127.0.0.1=loopback 127.255.255.255=loopback 128.0.0.0=ok
            169.253.255.255=ok 169.254.169.254=link_local 169.255.0.0=ok
            172.15.255.255=ok 172.16.0.0=private 172.31.255.255=private 172.32.0.0=ok
            192.0.0.170=reserved 192.0.1.0=ok 192.0.2.1=documentation 192.0.3.0=ok
            192.88.98.255=ok 192.88.99.1=reserved 192.88.100.0=ok
            192.167.255.255=ok 192.168.1.1=private 192.169.0.0=ok
            198.17.255.255=ok 198.18.0.0=benchmarking 198.19.255.255=benchmarking 198.20.0.0=ok
            198.51.99.255=ok 198.51.100.7=documentation 198.51.101.0=ok
            203.0.112.255=ok 203.0.113.9=documentation 203.0.114.0=ok
            223.255.255.255=ok 224.0.0.1=multicast 239.255.255.255=multicast
            240.0.0.0=reserved 255.255.255.254=reserved 255.255.255.255=broadcast
            8.8.8.8=ok 1.1.1.1=ok 93.184.216.34=ok",
        );
    }

    #[test]
    fn ipv6_ranges_block_inside_and_pass_just_outside() {
        checks(
            &[],
            "
            ::=unspecified ::1=loopback ::2=ipv4_compatible ::8.8.8.8=ipv4_compatible
            ::1:0:0=reserved 2001::1=teredo 2001:0:ffff:ffff::=teredo 2001:1::1=ok
            2001:2::1=benchmarking 2001:2:1::=ok 2001:db8::1=documentation 2001:db9::1=ok
            2001:db7:ffff::=ok 3fff:fff::1=documentation 3fff:1000::=ok
            100::1=discard 100:0:0:1::=reserved fbff::1=reserved
            fc00::1=unique_local fdff:ffff::1=unique_local fe7f::1=reserved
            fe80::1=link_local febf::1=link_local fec0::1=site_local feff::1=site_local
            ff02::1=multicast 1fff:ffff::1=reserved 2000::1=ok 4000::1=reserved
            2606:4700:4700::1111=ok 2a00:1450:4001::1=ok",
        );
    }

    #[test]
    fn ipv6_forms_carrying_ipv4_are_judged_by_that_ipv4() {
        checks(
            &[],
            "
            ::ffff:10.0.0.1=private@10.0.0.1 ::ffff:127.0.0.1=loopback@127.0.0.1
            ::ffff:0.0.0.0=unspecified@0.0.0.0 ::ffff:8.8.8.8=ok
            64:ff9b::a00:1=private@10.0.0.1 64:ff9b::a9fe:a9fe=link_local@169.254.169.254
            64:ff9b::808:808=ok 64:ff9b::1:808:808=reserved
            64:ff9b:1::a00:1=private@10.0.0.1 64:ff9b:1::6440:1=cgnat@100.64.0.1
            64:ff9b:1::10.0.0.1=private@10.0.0.1 64:ff9b:1::a9fe:a9fe=link_local@169.254.169.254
            64:ff9b:1::808:808=ok 64:ff9b:1:ffff::808:808=ok 64:ff9b:2::808:808=reserved
            2002:a00:1::1=private@10.0.0.1 2002:7f00:1::=loopback@127.0.0.1
            2002:c0a8:101::=private@192.168.1.1 2002:808:808::1=ok 2003::1=ok",
        );
    }

    #[test]
    fn nat64_local_use_is_read_at_every_layout_a_translator_could_use() {
        // RFC 6052 §2.2 layouts inside 64:ff9b:1::/48 (u octet = byte 8, suffix zero).
        checks(
            &[],
            "
            64:ff9b:1:0:a:0:800:0=private@10.0.0.8
            64:ff9b:1:0:7f:0:100:0=loopback@127.0.0.1
            64:ff9b:1:0:8:808:800:0=ok
            64:ff9b:1:c0:a8:101::=private@192.168.1.1
            64:ff9b:1:a00:1:100::=private@10.0.1.1
            64:ff9b:1:808:8:800::=unspecified@0.0.0.0
            64:ff9b:1:0:ff0a:0:800:0=ok
            64:ff9b:1::=unspecified@0.0.0.0",
        );
        // Exempting the embedded IPv4 exempts every reading that leads to it, no more.
        checks(
            &["10.0.0.8/32"],
            "64:ff9b:1:0:a:0:800:0=ok 64:ff9b:1:0:a:0:900:0=private@10.0.0.9",
        );
    }

    #[test]
    fn teredo_isatap_and_ipv4_compatible_forms_never_reach_private_ipv4() {
        checks(
            &[],
            "
            2001:0:4136:e378:8000:63bf:f5ff:fffe=teredo
            2001:0:a00:1:0:0:f5ff:fffe=teredo 2001:0:808:808::=teredo
            ::10.0.0.1=ipv4_compatible ::8.8.8.8=ipv4_compatible ::169.254.169.254=ipv4_compatible
            ::ffff:0:a00:1=reserved ::ffff:169.254.169.254=link_local@169.254.169.254
            2606:4700:1:2:0:5efe:a00:1=private@10.0.0.1
            2606:4700:1:2:200:5efe:c0a8:101=private@192.168.1.1
            2606:4700:1:2:300:5efe:7f00:1=loopback@127.0.0.1
            2606:4700:1:2:0:5efe:808:808=ok 2606:4700:1:2:400:5efe:a00:1=ok
            2606:4700:1:2:0:5eff:a00:1=ok",
        );
    }

    #[test]
    fn allow_private_exempts_the_address_or_its_embedded_ipv4() {
        checks(
            &["127.0.0.1/32"],
            "
            127.0.0.1=ok ::ffff:127.0.0.1=ok 64:ff9b::7f00:1=ok 2002:7f00:1::1=ok
            127.0.0.2=loopback ::1=loopback ::127.0.0.1=ipv4_compatible 10.0.0.1=private",
        );
        checks(
            &["10.0.0.0/8", "fd00::/8", "::ffff:0:0/96"],
            "
            10.1.2.3=ok fd00::1=ok ::ffff:192.168.0.1=ok 2002:a01:203::=ok
            192.168.0.1=private fc00::1=unique_local 64:ff9b::c0a8:1=private@192.168.0.1",
        );
    }

    #[test]
    fn reasons_have_stable_names_and_errors_name_the_embedded_ipv4() {
        let names: Vec<_> = BlockReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names.join(","),
            "unspecified,loopback,private,cgnat,link_local,reserved,documentation,benchmarking,\
             multicast,broadcast,ipv4_compatible,teredo,discard,unique_local,site_local"
        );
        let err = check_ip("::ffff:10.0.0.1".parse().unwrap(), &[]).unwrap_err();
        let text = "destination ::ffff:10.0.0.1 is blocked: private (embedded IPv4 10.0.0.1)";
        assert_eq!(err.to_string(), text);
        let err = check_ip("169.254.169.254".parse().unwrap(), &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "destination 169.254.169.254 is blocked: link_local"
        );
    }

    #[test]
    fn own_listeners_are_recognised_across_spellings() {
        own(
            &["127.0.0.1:8080", "127.0.0.1:8081"],
            "
            127.0.0.1:8080=yes 127.0.0.1:8081=yes 127.0.0.2:8081=yes [::1]:8080=yes
            [::ffff:127.0.0.1]:8081=yes 0.0.0.0:8080=yes [::]:8081=yes
            127.0.0.1:8082=no 10.0.0.1:8080=no 93.184.216.34:8080=no",
        );
        for unspecified in ["0.0.0.0:9000", "[::]:9000"] {
            own(
                &[unspecified],
                "
                127.0.0.1:9000=yes 127.9.9.9:9000=yes [::1]:9000=yes 0.0.0.0:9000=yes
                [::]:9000=yes 127.0.0.1:9001=no 10.0.0.5:9000=no 93.184.216.34:9000=no",
            );
        }
        own(
            &["10.0.0.5:7000"],
            "
            10.0.0.5:7000=yes [::ffff:10.0.0.5]:7000=yes 10.0.0.6:7000=no 127.0.0.1:7000=no",
        );
        own(&[], "127.0.0.1:8080=no");
    }
}
