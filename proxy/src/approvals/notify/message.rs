//! What an approver is told, rendered once for every channel: the mail subject, the plain
//! and HTML mail bodies, and the Slack Block Kit message.
//!
//! Every channel is built from the same list of facts ([`facts`]) so that a mail and a Slack
//! message can never disagree about what will run. The facts come only from what the proxy
//! observed (`Approval::observed`, `Approval::request`): an agent that wants a dangerous call
//! approved writes whatever summary helps it, so no text of its own choosing is shown as a
//! description. What it does control (URL, arguments, body) is shown as data, escaped for
//! the medium: HTML-escaped in mail, `&`/`<`/`>`-escaped and fenced as code in Slack, so it
//! can neither inject markup, links or `<!channel>` mentions, nor end its code block early.

use std::time::{Duration, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::approvals::model::Approval;

/// Why an approver was not told (the notifier retries; the approval itself is never lost).
/// No variant carries a secret: not the webhook URL, not the SMTP password.
#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    /// The webhook answered, but not with 2xx (Slack: 4xx for a bad payload or revoked
    /// webhook, 5xx when it is down).
    #[error("Slack webhook answered HTTP {status}")]
    SlackStatus { status: u16 },
    /// Slack could not be reached or did not answer in time. The error has its URL removed:
    /// an incoming-webhook URL is a bearer credential.
    #[error("Slack webhook unreachable: {0}")]
    SlackTransport(#[source] reqwest::Error),
    /// The SMTP relay refused the mail or could not be reached.
    #[error("SMTP delivery failed: {0}")]
    Smtp(#[source] lettre::transport::smtp::Error),
    /// The SMTP exchange took longer than allowed.
    #[error("SMTP delivery timed out after {0:?}")]
    SmtpTimeout(Duration),
    /// A sender or recipient address that is not an email address.
    #[error("{role} address {address:?} is invalid: {source}")]
    Address {
        role: &'static str,
        address: String,
        #[source]
        source: lettre::address::AddressError,
    },
    /// The mail could not be assembled.
    #[error("building the mail failed: {0}")]
    Message(#[source] lettre::error::Error),
    /// The channel's configuration cannot work (the reason says what, never the secret).
    #[error("notification channel misconfigured: {0}")]
    Config(String),
}

/// First notice, or one more after `approvals.ttl` passed without a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeKind {
    New,
    Reminder,
}

/// One notification round for one approval.
#[derive(Debug, Clone, Copy)]
pub struct Notice<'a> {
    pub approval: &'a Approval,
    pub kind: NoticeKind,
    /// `(approver, review-page URL signed for that approver)`: links are bound to one
    /// approver, so Slack shows one button per approver and each mail carries its own.
    pub links: &'a [(String, String)],
}

/// Longest arguments text shown in Slack, before escaping.
const SLACK_ARGS_CHARS: usize = 1500;
/// Slack refuses a whole message whose section text exceeds 3000 characters or a field
/// 2000, and escaping makes `&` five characters: an agent must not be able to make every
/// notice bounce by sending `&&&&…`, so the escaped text is bounded again.
pub(super) const SLACK_SECTION_MAX: usize = 2900;
const SLACK_FIELD_MAX: usize = 1900;
/// Longest arguments text in mail: the review page shows them whole.
const MAIL_ARGS_CHARS: usize = 8000;
/// Longest single fact value (a URL can be as long as the agent likes; Slack fields are
/// limited to 2000 characters).
const FACT_CHARS: usize = 600;
/// Slack's limits: header text 150, button text 75, elements per actions block 25.
pub(super) const SLACK_HEADER_CHARS: usize = 150;
pub(super) const SLACK_BUTTON_CHARS: usize = 75;
const SLACK_ACTIONS_PER_BLOCK: usize = 25;
/// Longest subject line (mail clients cut anyway; a URL must not make it a screenful).
pub(super) const SUBJECT_CHARS: usize = 160;

/// The mail subject (also the Slack fallback text and, cut shorter, its header).
pub fn subject(notice: &Notice) -> String {
    // A subject is a header: no line breaks or other controls from an agent's URL.
    cut(&one_line(&headline(notice)), SUBJECT_CHARS)
}

/// The plain-text mail body for one approver, whose review link is `link`.
pub fn email_text(notice: &Notice, link: &str) -> String {
    let a = notice.approval;
    let mut out = String::new();
    out.push_str(&headline(notice));
    out.push_str("\n\n");
    for (label, value) in facts(a) {
        out.push_str(&format!("{label}: {value}\n"));
    }
    out.push_str("\nArguments:\n");
    out.push_str(&cut_noted(&arguments(a), MAIL_ARGS_CHARS));
    out.push_str(
        "\n\nReview and decide (the page shows everything; opening it decides nothing):\n",
    );
    out.push_str(link);
    out.push_str("\n\n");
    out.push_str(&footer(a));
    out.push('\n');
    out
}

/// The HTML mail body: the same content as [`email_text`], every value escaped.
pub fn email_html(notice: &Notice, link: &str) -> String {
    let a = notice.approval;
    let mut out =
        String::from("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head><body>\n");
    out.push_str(&format!("<h2>{}</h2>\n<table>\n", html(&headline(notice))));
    for (label, value) in facts(a) {
        out.push_str(&format!(
            "<tr><th align=\"left\">{}</th><td>{}</td></tr>\n",
            html(label),
            html(&value)
        ));
    }
    out.push_str("</table>\n<h3>Arguments</h3>\n<pre>");
    out.push_str(&html(&cut_noted(&arguments(a), MAIL_ARGS_CHARS)));
    out.push_str("</pre>\n<p><a href=\"");
    out.push_str(&html(link));
    out.push_str(
        "\">Review and decide</a> (the page shows everything; opening it decides nothing)</p>\n<p>",
    );
    out.push_str(&html(link));
    out.push_str("</p>\n<p><small>");
    out.push_str(&html(&footer(a)));
    out.push_str("</small></p>\n</body></html>\n");
    out
}

/// The Slack incoming-webhook payload (Block Kit). The Approve/Deny buttons reach the proxy
/// as interactive callbacks (`action_id` `approve`/`deny`, `value` the approval id); the
/// per-approver buttons open that approver's review page.
pub fn slack_payload(notice: &Notice) -> Value {
    let a = notice.approval;
    let fields: Vec<Value> = facts(a)
        .into_iter()
        .map(|(label, value)| {
            json!({"type": "mrkdwn", "text": format!("*{label}*\n{}", slack_code(&value))})
        })
        .collect();
    let args = cut_noted(&arguments(a), SLACK_ARGS_CHARS);
    let mut blocks = vec![
        json!({
            "type": "header",
            "text": {"type": "plain_text", "text": cut(&one_line(&headline(notice)), SLACK_HEADER_CHARS)},
        }),
        json!({"type": "section", "fields": fields}),
        json!({
            "type": "section",
            "text": {"type": "mrkdwn", "text": format!("*Arguments*\n```{}```", slack_fenced(&args))},
        }),
    ];
    let mut buttons = vec![
        json!({
            "type": "button",
            "action_id": "approve",
            "text": {"type": "plain_text", "text": "Approve"},
            "value": a.id,
            "style": "primary",
        }),
        json!({
            "type": "button",
            "action_id": "deny",
            "text": {"type": "plain_text", "text": "Deny"},
            "value": a.id,
            "style": "danger",
        }),
    ];
    for (i, (approver, url)) in notice.links.iter().enumerate() {
        buttons.push(json!({
            "type": "button",
            // Unique within the message, as Slack requires; a click on a link button is
            // also reported to the interactivity URL, and `parse` refuses it as unknown.
            "action_id": format!("review-{i}"),
            "text": {"type": "plain_text", "text": cut(&format!("Review as {}", one_line(approver)), SLACK_BUTTON_CHARS)},
            "url": url,
        }));
    }
    for chunk in buttons.chunks(SLACK_ACTIONS_PER_BLOCK) {
        blocks.push(json!({"type": "actions", "elements": chunk}));
    }
    let mut context = vec![json!({"type": "mrkdwn", "text": slack_escape(&footer(a))})];
    if notice.links.is_empty() {
        context.push(json!({"type": "mrkdwn", "text": NO_LINKS_HERE}));
    }
    blocks.push(json!({"type": "context", "elements": context}));
    json!({
        // The fallback shown in notifications and by clients without Block Kit.
        "text": slack_escape(&subject(notice)),
        "blocks": blocks,
    })
}

/// Said in Slack when it carries no review links (`approvals.slack_links = "none"`).
pub(super) const NO_LINKS_HERE: &str = "No review link is posted here: a link acts as one \
     approver, and a channel is read by others. Approvers get their own by email or from \
     `ostiary approvals link`.";

/// The first line of every rendering.
pub(super) fn headline(notice: &Notice) -> String {
    let a = notice.approval;
    match notice.kind {
        NoticeKind::New => format!("Approval needed: {}", what(a)),
        NoticeKind::Reminder => format!(
            "Reminder: still waiting since {}: {}",
            utc(a.created_ms),
            what(a)
        ),
    }
}

/// The short name of what would run: the catalogued tool, else method and destination.
fn what(a: &Approval) -> String {
    match &a.observed.tool {
        Some(tool) => format!("{tool} on {} by {}", a.observed.host, a.agent),
        None => format!("{} {} by {}", a.request.method, destination(a), a.agent),
    }
}

fn destination(a: &Approval) -> String {
    let o = &a.observed;
    format!("{}://{}:{}", o.scheme, o.host, o.port)
}

/// The facts every channel shows, in this order.
pub(super) fn facts(a: &Approval) -> Vec<(&'static str, String)> {
    let o = &a.observed;
    let impact = match (o.records, o.cost) {
        (None, None) => "none declared".to_owned(),
        (records, cost) => {
            let mut parts = Vec::new();
            if let Some(r) = records {
                parts.push(format!("{r} records"));
            }
            if let Some(c) = cost {
                parts.push(format!("cost {c}"));
            }
            parts.join(", ")
        }
    };
    let policies = if a.policies.is_empty() {
        "none".to_owned()
    } else {
        a.policies.join(", ")
    };
    [
        (
            "Tool",
            o.tool
                .clone()
                .unwrap_or_else(|| "not a catalogued tool".to_owned()),
        ),
        ("Tier", o.tier.clone().unwrap_or_else(|| "none".to_owned())),
        ("Destination", destination(a)),
        ("Request", format!("{} {}", a.request.method, a.request.url)),
        (
            "Requested by",
            format!(
                "agent {} (tenant {}, session {})",
                a.agent, a.tenant, a.session
            ),
        ),
        ("Impact", impact),
        ("Policies", policies),
        ("Deadline", utc(a.deadline_ms)),
    ]
    .into_iter()
    .map(|(label, value)| (label, cut_noted(&one_line(&value), FACT_CHARS)))
    .collect()
}

/// The arguments as the proxy parsed them, else the body that will be sent.
fn arguments(a: &Approval) -> String {
    if let Some(args) = &a.observed.args {
        return serde_json::to_string_pretty(args)
            .unwrap_or_else(|e| format!("(unprintable: {e})"));
    }
    let body = &a.request.body;
    if body.is_empty() {
        return "(none)".to_owned();
    }
    match std::str::from_utf8(body) {
        Ok(text) => text.to_owned(),
        Err(_) => format!(
            "({} bytes, not UTF-8; SHA-256 {})",
            body.len(),
            a.request.body_digest
        ),
    }
}

fn footer(a: &Approval) -> String {
    format!(
        "Approval {} · request {} · notice {} · created {}",
        a.id,
        a.request_id,
        a.rounds.max(1),
        utc(a.created_ms)
    )
}

/// `2025-01-02T03:04:05Z`; times before 1970 (never written by the store) show as the epoch.
pub(super) fn utc(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Control characters (CR, LF, tabs, ANSI escapes, bidi overrides) replaced by spaces: a
/// fact is one line, and the agent must not make one fact look like two.
pub(super) fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || is_bidi_control(c) {
                ' '
            } else {
                c
            }
        })
        .collect()
}

/// Bidirectional overrides can make `evil.com/good.com` read as something else.
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{200e}' | '\u{200f}')
}

/// At most `max` characters in all, for Slack's hard limits: cut text ends with `…`.
pub(super) fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// At most `max` characters of `text`, cut on a character boundary, then a note of how
/// much was cut.
fn cut_noted(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((cut, _)) => format!(
            "{}… ({} more characters)",
            &text[..cut],
            text[cut..].chars().count()
        ),
    }
}

/// HTML text and attribute escaping.
pub(crate) fn html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The three characters Slack's mrkdwn gives meaning to (`<…>` links and mentions, `&`
/// entities), escaped as Slack documents.
pub(super) fn slack_escape(text: &str) -> String {
    slack_escape_within(text, usize::MAX)
}

/// [`slack_escape`], stopping (with `…`) before the result exceeds `max` characters, and
/// never inside an entity.
pub(super) fn slack_escape_within(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    let mut len = 0usize;
    for c in text.chars() {
        let piece = match c {
            '&' => "&amp;",
            '<' => "&lt;",
            '>' => "&gt;",
            _ => "",
        };
        let piece_len = if piece.is_empty() { 1 } else { piece.len() };
        if len + piece_len > max.saturating_sub(1) {
            out.push('…');
            return out;
        }
        if piece.is_empty() {
            out.push(c);
        } else {
            out.push_str(piece);
        }
        len += piece_len;
    }
    out
}

/// A value as inline code: no formatting, no auto-links. A backtick would end the code
/// span, so it becomes a look-alike (U+02CB).
fn slack_code(text: &str) -> String {
    format!(
        "`{}`",
        slack_escape_within(&text.replace('`', "\u{2cb}"), SLACK_FIELD_MAX)
    )
}

/// Text for a ``` block: a run of three backticks would close the block and let the rest
/// be read as mrkdwn, so a zero-width space breaks every such run, and a backtick at either
/// end is kept apart from the fence.
fn slack_fenced(text: &str) -> String {
    let mut out = slack_escape_within(
        &text.replace("```", "`\u{200b}`\u{200b}`"),
        SLACK_SECTION_MAX,
    );
    if out.starts_with('`') {
        out.insert(0, '\u{200b}');
    }
    if out.ends_with('`') {
        out.push('\u{200b}');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approvals::model::{HeldRequest, Observed, Status};

    fn approval() -> Approval {
        Approval {
            id: "apr_123".to_owned(),
            status: Status::Pending,
            created_ms: 1_700_000_000_000,
            deadline_ms: 1_700_086_400_000,
            renotify_ms: 1_700_000_900_000,
            rounds: 1,
            session: "ses_1".to_owned(),
            agent: "billing-bot".to_owned(),
            tenant: "acme".to_owned(),
            request_id: "req_9".to_owned(),
            policies: vec!["refunds-need-approval".to_owned()],
            policy_generation: 3,
            request: HeldRequest {
                method: "POST".to_owned(),
                url: "https://api.example.test:443/refunds?x=<b>".to_owned(),
                headers: vec![],
                body: br#"{"amount":500}"#.to_vec(),
                body_digest: "00".repeat(32),
            },
            observed: Observed {
                host: "api.example.test".to_owned(),
                port: 443,
                scheme: "https".to_owned(),
                action: r#"Ostiary::Action::"tool:payments.refund""#.to_owned(),
                resource: "Ostiary::Host::\"api.example.test\"".to_owned(),
                tool: Some("payments.refund".to_owned()),
                tier: Some("irreversible".to_owned()),
                args: Some(serde_json::json!({
                    "note": "<script>alert(1)</script> & <!channel> ```escape``` `x`",
                    "amount": 500
                })),
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

    fn links() -> Vec<(String, String)> {
        vec![
            (
                "alice@example.com".to_owned(),
                "http://127.0.0.1:8081/approve/tokA".to_owned(),
            ),
            (
                "bob@example.com".to_owned(),
                "http://127.0.0.1:8081/approve/tokB".to_owned(),
            ),
        ]
    }

    #[test]
    fn html_escapes_hostile_arguments_and_urls() {
        let a = approval();
        let links = links();
        let notice = Notice {
            approval: &a,
            kind: NoticeKind::New,
            links: &links,
        };
        let body = email_html(&notice, &links[0].1);
        assert!(!body.contains("<script>"), "{body}");
        assert!(
            body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{body}"
        );
        assert!(!body.contains("x=<b>"));
        assert!(body.contains("x=&lt;b&gt;"));
        assert!(body.contains("href=\"http://127.0.0.1:8081/approve/tokA\""));
        assert!(
            !body.contains("tokB"),
            "one approver's mail carries only their link"
        );
    }

    #[test]
    fn text_and_html_carry_the_same_facts() {
        let a = approval();
        let links = links();
        let notice = Notice {
            approval: &a,
            kind: NoticeKind::New,
            links: &links,
        };
        let text = email_text(&notice, &links[0].1);
        let body = email_html(&notice, &links[0].1);
        for (label, value) in facts(&a) {
            assert!(
                text.contains(&format!("{label}: {value}")),
                "{label} in {text}"
            );
            assert!(body.contains(&html(&value)), "{label} in html");
        }
        assert!(text.contains("payments.refund"));
        assert!(text.contains("https://api.example.test:443"));
        assert!(text.contains("1 records, cost 2.5"));
        assert!(text.contains("refunds-need-approval"));
        assert!(text.contains("agent billing-bot (tenant acme, session ses_1)"));
        assert!(text.contains("2023-11-15T22:13:20Z"), "deadline: {text}");
        assert!(text.contains("http://127.0.0.1:8081/approve/tokA"));
    }

    #[test]
    fn reminder_says_so_and_subject_is_one_line() {
        let mut a = approval();
        a.observed.tool = None;
        a.request.url = "https://api.example.test/x\r\nBcc: evil@example.com".to_owned();
        let notice = Notice {
            approval: &a,
            kind: NoticeKind::Reminder,
            links: &[],
        };
        let s = subject(&notice);
        assert!(
            s.starts_with("Reminder: still waiting since 2023-11-14T22:13:20Z"),
            "{s}"
        );
        assert!(!s.contains('\r') && !s.contains('\n'), "{s:?}");
        let new = Notice {
            approval: &a,
            kind: NoticeKind::New,
            ..notice
        };
        assert!(subject(&new).starts_with("Approval needed: POST https://api.example.test:443"));
        let payload = slack_payload(&notice);
        let header = payload["blocks"][0]["text"]["text"].as_str().unwrap();
        assert!(
            header.starts_with("Reminder: still waiting since"),
            "{header}"
        );
    }

    #[test]
    fn slack_escapes_mrkdwn_and_cannot_close_the_code_block() {
        let a = approval();
        let links = links();
        let notice = Notice {
            approval: &a,
            kind: NoticeKind::New,
            links: &links,
        };
        let payload = slack_payload(&notice);
        let text = serde_json::to_string(&payload).unwrap();
        assert!(!text.contains("<script>"), "{text}");
        assert!(!text.contains("<!channel>"), "{text}");
        assert!(text.contains("&lt;!channel&gt;"));
        assert!(text.contains("&amp;"));
        let args = payload["blocks"][2]["text"]["text"].as_str().unwrap();
        let inner = args
            .strip_prefix("*Arguments*\n```")
            .unwrap()
            .strip_suffix("```")
            .unwrap();
        assert!(!inner.contains("```"), "{inner}");
        // The URL is shown as code with its `<b>` escaped.
        let request = payload["blocks"][1]["fields"][3]["text"].as_str().unwrap();
        assert_eq!(
            request,
            "*Request*\n`POST https://api.example.test:443/refunds?x=&lt;b&gt;`"
        );
    }

    #[test]
    fn slack_buttons_decide_and_link_per_approver() {
        let a = approval();
        let links = links();
        let notice = Notice {
            approval: &a,
            kind: NoticeKind::New,
            links: &links,
        };
        let payload = slack_payload(&notice);
        let actions = payload["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "actions")
            .unwrap();
        let el = actions["elements"].as_array().unwrap();
        assert_eq!(el[0]["action_id"], "approve");
        assert_eq!(el[0]["value"], "apr_123");
        assert_eq!(el[0]["style"], "primary");
        assert_eq!(el[1]["action_id"], "deny");
        assert_eq!(el[1]["value"], "apr_123");
        assert_eq!(el[1]["style"], "danger");
        assert_eq!(el[2]["text"]["text"], "Review as alice@example.com");
        assert_eq!(el[2]["url"], "http://127.0.0.1:8081/approve/tokA");
        assert_eq!(el[3]["url"], "http://127.0.0.1:8081/approve/tokB");
        assert_ne!(el[2]["action_id"], el[3]["action_id"]);
        let fields = payload["blocks"][1]["fields"].as_array().unwrap();
        assert!(fields.len() <= 10, "Slack allows 10 fields");
        assert_eq!(
            fields[2]["text"],
            "*Destination*\n`https://api.example.test:443`"
        );
    }

    #[test]
    fn long_arguments_are_cut_for_slack() {
        let mut a = approval();
        a.observed.args = Some(serde_json::json!({"blob": "y".repeat(10_000)}));
        let notice = Notice {
            approval: &a,
            kind: NoticeKind::New,
            links: &[],
        };
        let payload = slack_payload(&notice);
        let args = payload["blocks"][2]["text"]["text"].as_str().unwrap();
        assert!(args.chars().count() < 3000, "{}", args.len());
        assert!(args.contains("more characters)"));
    }

    #[test]
    fn escaping_cannot_push_slack_past_its_limits() {
        let mut a = approval();
        a.observed.args = Some(serde_json::Value::String("&".repeat(5000)));
        a.request.url = format!("https://x.test/{}", "&".repeat(5000));
        let long_name = "n".repeat(200);
        let links = vec![(long_name, "http://127.0.0.1/approve/t".to_owned())];
        let notice = Notice {
            approval: &a,
            kind: NoticeKind::Reminder,
            links: &links,
        };
        let payload = slack_payload(&notice);
        let chars = |v: &Value| v.as_str().unwrap().chars().count();
        assert!(chars(&payload["blocks"][0]["text"]["text"]) <= 150);
        assert!(chars(&payload["blocks"][2]["text"]["text"]) <= 3000);
        for field in payload["blocks"][1]["fields"].as_array().unwrap() {
            assert!(chars(&field["text"]) <= 2000, "{field}");
        }
        let button = &payload["blocks"][3]["elements"][2]["text"]["text"];
        assert!(chars(button) <= 75, "{button}");
        // Cut between entities, never inside one.
        let args = payload["blocks"][2]["text"]["text"].as_str().unwrap();
        assert!(
            args.contains("&amp;&amp;…```") || args.contains("&amp;…```"),
            "{args}"
        );
    }

    #[test]
    fn backticks_at_the_edges_stay_inside_the_block() {
        assert_eq!(slack_fenced("`a`"), "\u{200b}`a`\u{200b}");
        assert!(!slack_fenced("x````y").contains("```"));
        assert_eq!(slack_code("a`b"), "`a\u{2cb}b`");
    }

    #[test]
    fn body_shown_when_no_args_and_controls_flattened() {
        let mut a = approval();
        a.observed.args = None;
        a.request.url = "https://x.test/\u{202e}moc.live".to_owned();
        let notice = Notice {
            approval: &a,
            kind: NoticeKind::New,
            links: &[],
        };
        let text = email_text(&notice, "http://127.0.0.1/approve/t");
        assert!(text.contains(r#"{"amount":500}"#));
        assert!(!text.contains('\u{202e}'));
        a.request.body = vec![0xff, 0xfe];
        let text = email_text(
            &Notice {
                approval: &a,
                kind: NoticeKind::New,
                links: &[],
            },
            "l",
        );
        assert!(text.contains("(2 bytes, not UTF-8"), "{text}");
    }
}
