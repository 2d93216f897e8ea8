//! The review page behind a signed link (`GET /approve/<token>`) and the form it posts.
//!
//! An approver decides from this page alone, so it shows what the proxy itself observed and
//! will send (tool, destination, method and URL, arguments, impact), never a summary the
//! agent wrote: a prompt-injected agent may describe a refund of 10 as a refund of 1. Every
//! piece of text goes through one escaper, which also makes invisible and bidirectional
//! control characters visible, so agent-controlled arguments can neither inject markup nor
//! make the rendered text read differently from the bytes that will be sent.
//!
//! The page has no JavaScript, and its headers ([`security_headers`]) forbid scripts,
//! framing (clickjacking the Approve button), foreign form targets and leaking the token in
//! a `Referer`. A GET renders only; deciding takes the form's POST, so mail scanners that
//! prefetch links change nothing.

use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use http::header::{self, HeaderName};
use http::HeaderValue;

use super::model::{Approval, Verdict};

/// Bodies and arguments longer than this are cut on the page (with a note); the full text
/// is what will be sent, and is stored with the approval.
pub const MAX_SHOWN_BYTES: usize = 64 * 1024;

/// Longest reason an approver may give (characters).
pub const MAX_REASON_CHARS: usize = 1000;

/// Largest form body [`parse_form`] reads: a decision and a reason fit easily.
pub const MAX_FORM_BYTES: usize = 16 * 1024;

const CSS: &str = "\
body{font-family:system-ui,sans-serif;max-width:56rem;margin:2rem auto;padding:0 1rem;\
color:#1b1b1b;line-height:1.45}\
h1{font-size:1.5rem;margin-bottom:.25rem}\
.lead{color:#555;margin-top:0}\
table{border-collapse:collapse;width:100%;margin:1rem 0}\
th,td{text-align:left;vertical-align:top;padding:.35rem .5rem;border-bottom:1px solid #ddd}\
th{width:11rem;color:#444;font-weight:600}\
td{word-break:break-all}\
pre{background:#f5f5f5;border:1px solid #ddd;padding:.75rem;overflow-x:auto;\
white-space:pre-wrap;word-break:break-all;max-height:32rem}\
.note{color:#8a4b00}\
.status{font-weight:700}\
form{margin:1.5rem 0;padding:1rem;border:1px solid #ccc;border-radius:6px}\
textarea{width:100%;min-height:4rem;box-sizing:border-box}\
button{font-size:1rem;padding:.5rem 1.5rem;margin:.75rem .75rem 0 0;border-radius:4px;\
border:1px solid #444;cursor:pointer}\
#approve{background:#1d6b2f;color:#fff}\
#deny{background:#a11;color:#fff}\
code{background:#f0f0f0;padding:0 .2rem}";

/// The review page for `approval`, addressed to `approver`, whose form posts to
/// `form_action` (the same `/approve/<token>` path). An approval that is no longer pending
/// gets no form: its status and who decided it are shown instead.
pub fn review(approval: &Approval, approver: &str, form_action: &str) -> String {
    let obs = &approval.observed;
    let mut out = String::with_capacity(8 * 1024);
    head(&mut out, "Approval requested");
    let what = obs.tool.as_deref().unwrap_or("an HTTP request");
    let _ = write!(
        out,
        "<h1>Approval requested: {}</h1>\n<p class=\"lead\">Agent <strong>{}</strong> wants to \
         run <strong>{}</strong> on <strong>{}</strong>. Everything below is what Ostiary \
         observed on the wire and will send, not the agent's own description.</p>\n",
        esc(what),
        esc(&approval.agent),
        esc(what),
        esc(&obs.host),
    );
    out.push_str("<table>\n");
    out.push_str(&facts(approval, approver).0);
    out.push_str("</table>\n");
    payload(&mut out, approval);
    if approval.status.is_open() {
        let _ = write!(
            out,
            "<form method=\"post\" action=\"{}\">\n\
             <label for=\"reason\">Reason (optional, recorded in the audit log)</label>\n\
             <textarea id=\"reason\" name=\"reason\" maxlength=\"{MAX_REASON_CHARS}\"></textarea>\n\
             <button type=\"submit\" id=\"approve\" name=\"decision\" value=\"approve\">Approve</button>\
             <button type=\"submit\" id=\"deny\" name=\"decision\" value=\"deny\">Deny</button>\n\
             <p class=\"note\">This link is for {} only and works once.</p>\n\
             </form>\n",
            esc(form_action),
            esc(approver),
        );
    } else {
        decided(&mut out, approval);
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// What the request is, who asked and when, and the status: the page's first table.
fn facts(approval: &Approval, approver: &str) -> Rows {
    let obs = &approval.observed;
    let req = &approval.request;
    let mut rows = Rows::default();
    match &obs.tool {
        Some(tool) => {
            rows.text("Tool", "tool", tool);
            if let Some(tier) = &obs.tier {
                rows.text("Risk tier", "tier", tier);
            }
        }
        None => rows.text("Tool", "tool", "HTTP request"),
    }
    let destination = format!("{}://{}:{}", obs.scheme, obs.host, obs.port);
    rows.text("Destination", "destination", &destination);
    rows.text("Request", "request", &format!("{} {}", req.method, req.url));
    if let Some(records) = obs.records {
        rows.text("Records affected", "records", &records.to_string());
    }
    if let Some(cost) = obs.cost {
        rows.text("Cost", "cost", &cost.to_string());
    }
    rows.text("Requesting agent", "agent", &approval.agent);
    rows.text("Tenant", "tenant", &approval.tenant);
    rows.text("Session", "session", &approval.session);
    rows.text(
        "Asked by policies",
        "policies",
        &if approval.policies.is_empty() {
            "(none recorded)".to_owned()
        } else {
            approval.policies.join(", ")
        },
    );
    rows.text("Requested at", "created", &utc(approval.created_ms));
    rows.text("Decide before", "deadline", &utc(approval.deadline_ms));
    rows.text(
        "Idempotency key",
        "idempotency-key",
        &approval.idempotency_key(),
    );
    rows.text("Addressed to", "approver", approver);
    rows.html(
        "Status",
        &format!(
            "<span id=\"status\" class=\"status\">{}</span>",
            esc(approval.status.as_str())
        ),
    );
    rows
}

/// What will be sent: the arguments as the proxy parsed them (what policy saw), or for a
/// plain HTTP request the body, and the request's headers.
fn payload(out: &mut String, approval: &Approval) {
    let req = &approval.request;
    match &approval.observed.args {
        Some(args) => {
            let pretty = serde_json::to_string_pretty(args).unwrap_or_else(|_| args.to_string());
            block(out, "Arguments", "args", &pretty);
            let title = format!("Request body ({} bytes)", req.body.len());
            out.push_str("<details>");
            let _ = write!(out, "<summary>{}</summary>", esc(&title));
            body_pre(out, "body", &req.body);
            out.push_str("</details>\n");
        }
        None => {
            let _ = writeln!(out, "<h2>Body ({} bytes)</h2>", req.body.len());
            body_pre(out, "args", &req.body);
        }
    }
    out.push_str("<h2>Request headers</h2>\n");
    if req.headers.is_empty() {
        out.push_str("<p id=\"headers\">(none)</p>\n");
    } else {
        out.push_str("<table id=\"headers\">\n");
        for (name, value) in &req.headers {
            let _ = writeln!(
                out,
                "<tr><th>{}</th><td>{}</td></tr>",
                esc(name),
                esc(value)
            );
        }
        out.push_str("</table>\n");
    }
    out.push_str(
        "<p class=\"note\">Credentials are not shown: Ostiary removed the agent's and injects \
         its own at execution.</p>\n",
    );
}

/// In place of the form, for an approval no longer waiting: who decided it, how, when and
/// why, and what the upstream answered.
fn decided(out: &mut String, approval: &Approval) {
    out.push_str(
        "<div id=\"decided\">\n<p>This approval is no longer waiting for a decision.</p>\n",
    );
    let mut facts = Rows::default();
    if let Some(who) = &approval.approver {
        facts.text("Decided by", "decided-by", who);
    }
    if let Some(channel) = approval.channel {
        facts.text("Via", "decided-via", channel.as_str());
    }
    if let Some(ms) = approval.decided_ms {
        facts.text("Decided at", "decided-at", &utc(ms));
    }
    if let Some(reason) = &approval.reason {
        facts.text("Reason", "decided-reason", reason);
    }
    if let Some(result) = &approval.result {
        facts.text(
            "Upstream answered",
            "result-status",
            &result.status.to_string(),
        );
    }
    if !facts.0.is_empty() {
        out.push_str("<table>\n");
        out.push_str(&facts.0);
        out.push_str("</table>\n");
    }
    out.push_str("</div>\n");
}

/// A short page for results and refusals ("Approved", "Link already used", "Not an
/// approver", ...). Both texts are escaped.
pub fn outcome(title: &str, message: &str) -> String {
    let mut out = String::with_capacity(1024);
    head(&mut out, title);
    let _ = write!(
        out,
        "<h1 id=\"outcome\">{}</h1>\n<p id=\"message\">{}</p>\n</body>\n</html>\n",
        esc(title),
        esc(message)
    );
    out
}

/// Reads the review form (`application/x-www-form-urlencoded`): `decision` exactly once and
/// exactly `approve` or `deny`; `reason` at most once, trimmed, empty means none. Other
/// fields are ignored. The error is a sentence for the approver.
pub fn parse_form(body: &[u8]) -> Result<(Verdict, Option<String>), String> {
    if body.len() > MAX_FORM_BYTES {
        return Err(format!("the form is larger than {MAX_FORM_BYTES} bytes"));
    }
    let mut decision = None;
    let mut reason = None;
    for (name, value) in url::form_urlencoded::parse(body) {
        match name.as_ref() {
            "decision" => {
                if decision.is_some() {
                    return Err("the form carries more than one decision".to_owned());
                }
                decision = Some(match value.as_ref() {
                    "approve" => Verdict::Approve,
                    "deny" => Verdict::Deny,
                    _ => return Err("the decision must be approve or deny".to_owned()),
                });
            }
            "reason" => {
                if reason.is_some() {
                    return Err("the form carries more than one reason".to_owned());
                }
                reason = Some(value.trim().to_owned());
            }
            _ => {}
        }
    }
    let decision = decision.ok_or_else(|| "the form carries no decision".to_owned())?;
    let reason = reason.filter(|r| !r.is_empty());
    if let Some(r) = &reason {
        if r.chars().count() > MAX_REASON_CHARS {
            return Err(format!(
                "the reason is longer than {MAX_REASON_CHARS} characters"
            ));
        }
    }
    Ok((decision, reason))
}

/// Headers for every page here: no script, no framing, the form posts only to us, the
/// token in the URL never leaves in a `Referer`, and no cache keeps a page that shows a
/// request's arguments.
pub fn security_headers() -> [(HeaderName, HeaderValue); 6] {
    [
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(
                "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; \
                 frame-ancestors 'none'; base-uri 'none'",
            ),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        ),
    ]
}

/// HTML-escapes `text` for element content and quoted attributes, and shows characters that
/// would otherwise be invisible or reorder the rendering (C0/C1 controls except newline and
/// tab, zero-width and bidirectional marks) as `\u{..}`, so what the approver reads is what
/// the bytes say.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\n' | '\t' => out.push(c),
            c if is_deceptive(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

fn is_deceptive(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{200b}'..='\u{200f}'   // zero-width space/joiners, LRM, RLM
            | '\u{202a}'..='\u{202e}' // bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
            | '\u{2066}'..='\u{2069}' // bidi isolates
            | '\u{061c}'              // Arabic letter mark
            | '\u{feff}'              // BOM / zero-width no-break space
            | '\u{00ad}'              // soft hyphen
        )
}

/// `<th>label</th><td id=..>value</td>` rows, escaped.
#[derive(Default)]
struct Rows(String);

impl Rows {
    fn text(&mut self, label: &str, id: &str, value: &str) {
        let _ = writeln!(
            self.0,
            "<tr><th>{}</th><td id=\"{}\">{}</td></tr>",
            esc(label),
            esc(id),
            esc(value)
        );
    }

    /// `html` must already be escaped.
    fn html(&mut self, label: &str, html: &str) {
        let _ = writeln!(self.0, "<tr><th>{}</th><td>{html}</td></tr>", esc(label));
    }
}

fn head(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <meta name=\"robots\" content=\"noindex, nofollow\">\n\
         <link rel=\"icon\" href=\"data:,\">\n\
         <title>{} · Ostiary</title>\n<style>{CSS}</style>\n</head>\n<body>\n",
        esc(title)
    );
}

/// A titled `<pre>`, cut at [`MAX_SHOWN_BYTES`] with a note.
fn block(out: &mut String, title: &str, id: &str, text: &str) {
    let _ = writeln!(out, "<h2>{}</h2>", esc(title));
    pre(out, id, text);
}

fn pre(out: &mut String, id: &str, text: &str) {
    let shown = cut(text, MAX_SHOWN_BYTES);
    let _ = writeln!(out, "<pre id=\"{}\">{}</pre>", esc(id), esc(shown));
    if shown.len() < text.len() {
        let _ = writeln!(
            out,
            "<p class=\"note\">Truncated: the first {} of {} bytes are shown; all of it will \
             be sent.</p>",
            shown.len(),
            text.len()
        );
    }
}

/// The body as text when it is UTF-8; otherwise only its size, since bytes rendered as
/// text would mislead more than they inform.
fn body_pre(out: &mut String, id: &str, body: &[u8]) {
    if body.is_empty() {
        let _ = writeln!(out, "<pre id=\"{}\">(empty body)</pre>", esc(id));
        return;
    }
    match std::str::from_utf8(body) {
        Ok(text) => pre(out, id, text),
        Err(_) => {
            let _ = writeln!(
                out,
                "<pre id=\"{}\">{} bytes of binary data</pre>",
                esc(id),
                body.len()
            );
        }
    }
}

/// The longest prefix of `text` within `max` bytes that ends on a character boundary.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `2026-11-30 09:42:56 UTC`. Clamped to what RFC 3339 can show; the proxy makes these
/// times, so the clamp only guards against a corrupt store.
fn utc(ms: i64) -> String {
    const MAX_MS: i64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    let ms = u64::try_from(ms.clamp(0, MAX_MS)).unwrap_or(0);
    let at = UNIX_EPOCH + Duration::from_millis(ms);
    let text = humantime::format_rfc3339_seconds(at).to_string();
    format!("{} UTC", text.trim_end_matches('Z').replacen('T', " ", 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approvals::model::{Channel, HeldRequest, Observed, Status};
    use serde_json::json;

    fn approval() -> Approval {
        Approval {
            id: "apr_0123".into(),
            status: Status::Pending,
            created_ms: 1_800_000_000_000,
            deadline_ms: 1_800_000_900_000,
            renotify_ms: 1_800_000_300_000,
            rounds: 1,
            session: "ses_42".into(),
            agent: "billing-bot".into(),
            tenant: "acme".into(),
            request_id: "req_1".into(),
            policies: vec!["irreversible-needs-approval".into()],
            policy_generation: 3,
            request: HeldRequest {
                method: "POST".into(),
                url: "https://pay.example.com:443/mcp?x=1&y=2".into(),
                headers: vec![("content-type".into(), "application/json".into())],
                body: br#"{"jsonrpc":"2.0"}"#.to_vec(),
                body_digest: "00".into(),
            },
            observed: Observed {
                host: "pay.example.com".into(),
                port: 443,
                scheme: "https".into(),
                action: "Ostiary::Action::\"tool:payments.refund\"".into(),
                resource: "Ostiary::Host::\"pay.example.com\"".into(),
                tool: Some("payments.refund".into()),
                tier: Some("irreversible".into()),
                args: Some(json!({"amount": 1000, "currency": "EUR"})),
                args_hash: None,
                records: Some(1),
                cost: Some(2.5),
                rpc_id: None,
            },
            approver: None,
            channel: None,
            decided_ms: None,
            reason: None,
            attempts: 0,
            result: None,
            held_policy_version: None,
            executed_policy_version: None,
        }
    }

    #[test]
    fn shows_what_was_observed() {
        let html = review(&approval(), "alice@example.com", "/approve/tok");
        for needle in [
            "<td id=\"tool\">payments.refund</td>",
            "<td id=\"tier\">irreversible</td>",
            "<td id=\"destination\">https://pay.example.com:443</td>",
            "POST https://pay.example.com:443/mcp?x=1&amp;y=2",
            "&quot;amount&quot;: 1000",
            "<td id=\"agent\">billing-bot</td>",
            "<td id=\"tenant\">acme</td>",
            "<td id=\"session\">ses_42</td>",
            "irreversible-needs-approval",
            "2027-01-15 08:00:00 UTC",
            "2027-01-15 08:15:00 UTC",
            "ostiary-apr_0123",
            "alice@example.com",
            "<td id=\"records\">1</td>",
            "<td id=\"cost\">2.5</td>",
            "<span id=\"status\" class=\"status\">pending</span>",
            "<form method=\"post\" action=\"/approve/tok\">",
            "id=\"approve\" name=\"decision\" value=\"approve\"",
            "id=\"deny\" name=\"decision\" value=\"deny\"",
            "name=\"reason\"",
            "content-type",
        ] {
            assert!(html.contains(needle), "missing {needle:?} in\n{html}");
        }
        assert!(!html.contains("<script"));
    }

    #[test]
    fn agent_controlled_text_renders_as_text() {
        let mut a = approval();
        let evil = "</pre><script>alert(1)</script><img src=x onerror='alert(2)'>";
        a.observed.args = Some(json!({ "note": evil }));
        a.observed.tool = Some(evil.into());
        a.agent = evil.into();
        a.request.headers = vec![(evil.into(), evil.into())];
        a.request.body = evil.as_bytes().to_vec();
        let html = review(&a, evil, "/approve/\"><script>");
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(!html.contains("</pre><"));
        assert!(html.contains("&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains("action=\"/approve/&quot;&gt;&lt;script&gt;\""));
        let page = outcome(evil, evil);
        assert!(!page.contains("<script") && !page.contains("<img"));
    }

    #[test]
    fn invisible_and_bidi_characters_are_shown() {
        assert_eq!(esc("a\u{202e}b"), "a\\u{202e}b");
        assert_eq!(esc("x\u{200b}\u{0}y"), "x\\u{200b}\\u{0000}y");
        assert_eq!(esc("line\nnext\tcol"), "line\nnext\tcol");
        assert_eq!(esc("&<>\"'"), "&amp;&lt;&gt;&quot;&#39;");
        assert_eq!(esc("Grüße ✓"), "Grüße ✓");
    }

    #[test]
    fn plain_http_request_shows_its_body() {
        let mut a = approval();
        a.observed.tool = None;
        a.observed.tier = None;
        a.observed.args = None;
        a.observed.records = None;
        a.observed.cost = None;
        a.request.body = b"amount=1000".to_vec();
        let html = review(&a, "bob", "/approve/t");
        assert!(html.contains("<td id=\"tool\">HTTP request</td>"));
        assert!(html.contains("<pre id=\"args\">amount=1000</pre>"));
        assert!(!html.contains("id=\"records\"") && !html.contains("id=\"tier\""));

        a.request.body = vec![0xff, 0x00, 0x80];
        let html = review(&a, "bob", "/approve/t");
        assert!(html.contains("<pre id=\"args\">3 bytes of binary data</pre>"));

        a.request.body = Vec::new();
        assert!(review(&a, "bob", "/t").contains("<pre id=\"args\">(empty body)</pre>"));
    }

    #[test]
    fn long_bodies_are_cut_with_a_note() {
        let mut a = approval();
        a.observed.args = None;
        // Multi-byte characters straddle the cut.
        a.request.body = "é".repeat(MAX_SHOWN_BYTES).into_bytes();
        let html = review(&a, "bob", "/t");
        assert!(html.contains(&format!(
            "Truncated: the first {MAX_SHOWN_BYTES} of {} bytes",
            2 * MAX_SHOWN_BYTES
        )));
        assert!(html.len() < 3 * MAX_SHOWN_BYTES / 2 + 16 * 1024);
    }

    #[test]
    fn decided_approval_has_no_form() {
        let mut a = approval();
        a.status = Status::Denied;
        a.approver = Some("carol".into());
        a.channel = Some(Channel::Slack);
        a.decided_ms = Some(1_800_000_060_000);
        a.reason = Some("not today".into());
        let html = review(&a, "alice", "/approve/t");
        assert!(!html.contains("<form"));
        assert!(!html.contains("id=\"approve\""));
        assert!(html.contains("<span id=\"status\" class=\"status\">denied</span>"));
        assert!(html.contains("<td id=\"decided-by\">carol</td>"));
        assert!(html.contains("<td id=\"decided-via\">slack</td>"));
        assert!(html.contains("2027-01-15 08:01:00 UTC"));
        assert!(html.contains("not today"));
    }

    #[test]
    fn form_parsing() {
        assert_eq!(
            parse_form(b"decision=approve"),
            Ok((Verdict::Approve, None))
        );
        assert_eq!(
            parse_form(b"reason=too+risky%21&decision=deny"),
            Ok((Verdict::Deny, Some("too risky!".into())))
        );
        assert_eq!(
            parse_form(b"reason=++&decision=approve&extra=1"),
            Ok((Verdict::Approve, None))
        );
        for bad in [
            &b""[..],
            b"reason=x",
            b"decision=Approve",
            b"decision=approve%20",
            b"decision=yes",
            b"decision=",
            b"decision=approve&decision=deny",
            b"decision=approve&decision=approve",
            b"decision=deny&reason=a&reason=b",
        ] {
            assert!(parse_form(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let long = format!("decision=deny&reason={}", "x".repeat(MAX_REASON_CHARS + 1));
        assert!(parse_form(long.as_bytes()).is_err());
        let max = format!("decision=deny&reason={}", "é".repeat(MAX_REASON_CHARS));
        assert!(parse_form(max.as_bytes()).is_ok());
        assert!(parse_form(&vec![b'a'; MAX_FORM_BYTES + 1]).is_err());
    }

    #[test]
    fn headers_lock_the_page_down() {
        let headers = security_headers();
        let get = |name: HeaderName| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_str().unwrap())
                .unwrap()
        };
        let csp = get(header::CONTENT_SECURITY_POLICY);
        for part in [
            "default-src 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        ] {
            assert!(csp.contains(part));
        }
        assert_eq!(get(header::X_FRAME_OPTIONS), "DENY");
        assert_eq!(get(header::REFERRER_POLICY), "no-referrer");
        assert_eq!(get(header::CACHE_CONTROL), "no-store");
        assert_eq!(get(header::X_CONTENT_TYPE_OPTIONS), "nosniff");
        assert_eq!(get(header::CONTENT_TYPE), "text/html; charset=utf-8");
    }

    #[test]
    fn times_are_utc_and_clamped() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(-5), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(i64::MAX), "9999-12-31 23:59:59 UTC");
    }
}
