//! A digest: the notices that came due for one recipient while its rate limit was closed,
//! sent as one message when it opens (docs/design.md §10 as amended: a flood of holds must not
//! become a flood of mail and Slack posts).
//!
//! Each approval is listed with the same short facts and, as in a single notice, the
//! recipient's own review link (mail) or the Approve/Deny buttons and, only with
//! `approvals.slack_links = "shared"`, the per-approver link buttons (Slack). Everything the
//! agent controls is escaped exactly as in [`super::message`].

use std::time::Duration;

use serde_json::{json, Value};

use super::message::{
    cut, facts, headline, html, one_line, slack_escape, slack_escape_within, utc, Notice,
    NO_LINKS_HERE, SLACK_BUTTON_CHARS, SLACK_HEADER_CHARS, SLACK_SECTION_MAX, SUBJECT_CHARS,
};

/// Most approvals listed in one digest message; more go out as further messages of the same
/// digest. Slack allows 50 blocks a message, and each approval takes two.
pub const MAX_ITEMS: usize = 20;

/// The facts of a single notice a digest repeats per approval (the rest is on its page).
const LISTED: &[&str] = &["Request", "Requested by", "Impact", "Deadline"];

/// One digest message to one recipient.
#[derive(Debug, Clone, Copy)]
pub struct Digest<'a> {
    /// At most [`MAX_ITEMS`]; each notice's `links` are what that recipient may follow.
    pub notices: &'a [Notice<'a>],
    /// The recipient's rate-limit window, said in the message so nobody waits for more.
    pub window: Duration,
    /// Approvals in the whole digest, when it takes several messages.
    pub total: usize,
}

/// The mail subject.
pub fn subject(d: &Digest) -> String {
    let first = d
        .notices
        .first()
        .map(|n| one_line(&headline(n)))
        .unwrap_or_default();
    cut(
        &format!("{} approvals waiting — {first}", d.total),
        SUBJECT_CHARS,
    )
}

fn intro(d: &Digest) -> String {
    let part = if d.total > d.notices.len() {
        format!(" ({} of them in this message)", d.notices.len())
    } else {
        String::new()
    };
    format!(
        "{} requests wait for a decision{part}. Notifications to you are collected: at most \
         one message every {}.",
        d.total,
        humantime::format_duration(d.window)
    )
}

fn listed(notice: &Notice) -> Vec<(&'static str, String)> {
    facts(notice.approval)
        .into_iter()
        .filter(|(label, _)| LISTED.contains(label))
        .collect()
}

/// The plain-text mail body.
pub fn email_text(d: &Digest) -> String {
    let mut out = intro(d);
    out.push_str("\n\n");
    for (i, notice) in d.notices.iter().enumerate() {
        out.push_str(&format!("{}. {}\n", i + 1, one_line(&headline(notice))));
        for (label, value) in listed(notice) {
            out.push_str(&format!("   {label}: {value}\n"));
        }
        for (_, link) in notice.links {
            out.push_str(&format!("   Review and decide: {link}\n"));
        }
        out.push_str(&format!("   Approval {}\n\n", notice.approval.id));
    }
    out.push_str("Opening a link decides nothing; its page shows everything and asks.\n");
    out
}

/// The HTML mail body: the same content as [`email_text`], every value escaped.
pub fn email_html(d: &Digest) -> String {
    let mut out =
        String::from("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"></head><body>\n");
    out.push_str(&format!("<p>{}</p>\n<ol>\n", html(&intro(d))));
    for notice in d.notices {
        out.push_str(&format!(
            "<li><h3>{}</h3>\n<table>\n",
            html(&one_line(&headline(notice)))
        ));
        for (label, value) in listed(notice) {
            out.push_str(&format!(
                "<tr><th align=\"left\">{}</th><td>{}</td></tr>\n",
                html(label),
                html(&value)
            ));
        }
        out.push_str("</table>\n");
        for (_, link) in notice.links {
            out.push_str(&format!(
                "<p><a href=\"{0}\">Review and decide</a> {0}</p>\n",
                html(link)
            ));
        }
        out.push_str(&format!(
            "<p><small>Approval {}</small></p></li>\n",
            html(&notice.approval.id)
        ));
    }
    out.push_str(
        "</ol>\n<p><small>Opening a link decides nothing; its page shows everything and \
         asks.</small></p>\n</body></html>\n",
    );
    out
}

/// The Slack incoming-webhook payload: per approval a section and its buttons.
pub fn slack_payload(d: &Digest) -> Value {
    let mut blocks = vec![json!({
        "type": "header",
        "text": {"type": "plain_text", "text": cut(&format!("{} approvals waiting", d.total), SLACK_HEADER_CHARS)},
    })];
    let any_links = d.notices.iter().any(|n| !n.links.is_empty());
    for (i, notice) in d.notices.iter().enumerate() {
        let a = notice.approval;
        let mut text = format!(
            "*{}. {}*",
            i + 1,
            slack_escape_within(&one_line(&headline(notice)), SLACK_HEADER_CHARS)
        );
        // Escaping can make a fact five times longer: each gets a share of Slack's section
        // limit, cut between entities, never inside one.
        let share = (SLACK_SECTION_MAX - SLACK_HEADER_CHARS * 6) / LISTED.len();
        for (label, value) in listed(notice) {
            text.push_str(&format!("\n*{label}* {}", code_within(&value, share)));
        }
        blocks.push(json!({"type": "section", "text": {"type": "mrkdwn", "text": text}}));
        let mut buttons = vec![
            json!({"type": "button", "action_id": "approve", "value": a.id, "style": "primary",
                   "text": {"type": "plain_text", "text": "Approve"}}),
            json!({"type": "button", "action_id": "deny", "value": a.id, "style": "danger",
                   "text": {"type": "plain_text", "text": "Deny"}}),
        ];
        // Slack allows 25 elements an actions block: the two buttons and 23 links.
        for (j, (approver, url)) in notice.links.iter().take(23).enumerate() {
            buttons.push(json!({
                "type": "button",
                "action_id": format!("review-{j}"),
                "text": {"type": "plain_text", "text": cut(&format!("Review as {}", one_line(approver)), SLACK_BUTTON_CHARS)},
                "url": url,
            }));
        }
        blocks.push(json!({"type": "actions", "elements": buttons}));
    }
    let mut context = vec![json!({"type": "mrkdwn", "text": slack_escape(&format!(
        "{} · posts to this channel are collected: at most one every {} · {}",
        intro_short(d),
        humantime::format_duration(d.window),
        utc(crate::store::now_ms())
    ))})];
    if !any_links {
        context.push(json!({"type": "mrkdwn", "text": NO_LINKS_HERE}));
    }
    blocks.push(json!({"type": "context", "elements": context}));
    json!({
        "text": slack_escape(&subject(d)),
        "blocks": blocks,
    })
}

/// [`slack_code`] within `max` characters.
fn code_within(text: &str, max: usize) -> String {
    format!(
        "`{}`",
        slack_escape_within(&text.replace('`', "\u{2cb}"), max)
    )
}

fn intro_short(d: &Digest) -> String {
    if d.total > d.notices.len() {
        format!("{} of {} approvals", d.notices.len(), d.total)
    } else {
        format!("{} approvals", d.total)
    }
}

#[cfg(test)]
mod tests {
    use super::super::message::NoticeKind;
    use super::*;
    use crate::approvals::model::{Approval, HeldRequest, Observed, Status};

    fn approval(id: &str, note: &str) -> Approval {
        Approval {
            id: id.to_owned(),
            status: Status::Pending,
            created_ms: 1_700_000_000_000,
            deadline_ms: 1_700_086_400_000,
            renotify_ms: 1_700_000_900_000,
            rounds: 1,
            session: "ses_1".into(),
            agent: "billing-bot".into(),
            tenant: "acme".into(),
            request_id: "req_1".into(),
            policies: vec!["refunds-need-approval".into()],
            policy_generation: 1,
            request: HeldRequest {
                method: "POST".into(),
                url: format!("https://api.example.test/refunds?note={note}"),
                headers: Vec::new(),
                body: Vec::new(),
                body_digest: String::new(),
            },
            observed: Observed {
                host: "api.example.test".into(),
                port: 443,
                scheme: "https".into(),
                tool: Some("payments.refund".into()),
                ..Default::default()
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
    fn mail_lists_each_approval_with_its_link_escaped() {
        let a = approval("apr_1", "<b>&");
        let b = approval("apr_2", "x");
        let la = vec![("alice".to_owned(), "http://h/approve/tokA".to_owned())];
        let lb = vec![("alice".to_owned(), "http://h/approve/tokB".to_owned())];
        let notices = [
            Notice {
                approval: &a,
                kind: NoticeKind::New,
                links: &la,
            },
            Notice {
                approval: &b,
                kind: NoticeKind::Reminder,
                links: &lb,
            },
        ];
        let d = Digest {
            notices: &notices,
            window: Duration::from_secs(60),
            total: 2,
        };
        let text = email_text(&d);
        assert!(text.starts_with("2 requests wait"), "{text}");
        assert!(text.contains("1m"), "{text}");
        for needle in ["apr_1", "apr_2", "tokA", "tokB", "Reminder: still waiting"] {
            assert!(text.contains(needle), "{needle} in {text}");
        }
        let body = email_html(&d);
        assert!(!body.contains("<b>&"), "{body}");
        assert!(body.contains("&lt;b&gt;&amp;"), "{body}");
        assert!(subject(&d).starts_with("2 approvals waiting"));
        assert!(!subject(&d).contains('\n'));
    }

    #[test]
    fn slack_digest_has_buttons_per_approval_and_no_links_unless_shared() {
        let a = approval("apr_1", "<!channel>");
        let b = approval("apr_2", "x");
        let notices = [
            Notice {
                approval: &a,
                kind: NoticeKind::New,
                links: &[],
            },
            Notice {
                approval: &b,
                kind: NoticeKind::New,
                links: &[],
            },
        ];
        let d = Digest {
            notices: &notices,
            window: Duration::from_secs(30),
            total: 5,
        };
        let payload = slack_payload(&d);
        let text = payload.to_string();
        assert!(!text.contains("<!channel>"), "{text}");
        assert!(!text.contains("/approve/"), "{text}");
        let values: Vec<(String, String)> = payload["blocks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["type"] == "actions")
            .flat_map(|b| b["elements"].as_array().unwrap().clone())
            .map(|e| {
                (
                    e["action_id"].as_str().unwrap().to_owned(),
                    e["value"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            values,
            [
                ("approve", "apr_1"),
                ("deny", "apr_1"),
                ("approve", "apr_2"),
                ("deny", "apr_2")
            ]
            .map(|(x, y)| (x.to_owned(), y.to_owned()))
        );
        assert!(text.contains("2 of 5 approvals"), "{text}");
        assert!(payload["blocks"].as_array().unwrap().len() <= 50);
    }

    #[test]
    fn a_full_digest_stays_within_slack_s_limits() {
        let approvals: Vec<Approval> = (0..MAX_ITEMS)
            .map(|i| approval(&format!("apr_{i}"), &"&".repeat(5000)))
            .collect();
        let links: Vec<(String, String)> = (0..30)
            .map(|j| (format!("approver{j}"), format!("http://h/approve/t{j}")))
            .collect();
        let notices: Vec<Notice> = approvals
            .iter()
            .map(|a| Notice {
                approval: a,
                kind: NoticeKind::New,
                links: &links,
            })
            .collect();
        let d = Digest {
            notices: &notices,
            window: Duration::from_secs(60),
            total: MAX_ITEMS,
        };
        let payload = slack_payload(&d);
        let blocks = payload["blocks"].as_array().unwrap();
        assert!(blocks.len() <= 50, "{}", blocks.len());
        for block in blocks {
            if let Some(text) = block["text"]["text"].as_str() {
                assert!(text.chars().count() <= 3000, "{}", text.len());
            }
            if let Some(elements) = block["elements"].as_array() {
                assert!(elements.len() <= 25);
            }
        }
    }
}
