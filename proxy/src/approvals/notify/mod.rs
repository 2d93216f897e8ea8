//! Telling approvers that something waits for them: a Slack message to the incoming
//! webhook's channel and one email per approver address.
//!
//! Notifications go through the store's outbox ([`super::store::ApprovalStore::enqueue`]):
//! the hold commits them together with the approval, and [`deliver_due`] sends what is due,
//! retrying failures with doubling backoff until they go through or the approval is decided.
//! A notification channel that is down never loses or blocks an approval; it shows on
//! `/metrics` (`ostiary_approval_notifications_failing`) and in `ostiary approvals show`.
//!
//! **Rate-limited and batched per recipient** (one mailbox; the Slack channel): the first
//! notification of a quiet spell goes out at once and closes the recipient for
//! `approvals.digest_window`; what comes due meanwhile is collected and sent as one digest
//! (each approval with its link or buttons) when the window ends, which closes it again.
//! The rate state is in the database with the outbox, so a restart neither resends a
//! "first" notice nor loses a collected one: every approval still reaches every approver,
//! a flood of holds just cannot become a flood of messages.
//!
//! - [`message`] — what a notification says (from what the proxy observed).
//! - [`digest`] — several of them as one message.
//! - [`slack`] — the incoming-webhook client.
//! - [`email`] — SMTP with lettre.

pub mod digest;
pub mod email;
pub mod message;
pub mod slack;

use std::time::Duration;

use self::digest::Digest;
use self::email::Mailer;
use self::message::{Notice, NoticeKind, NotifyError};
use self::slack::SlackWebhook;
use super::model::{Approval, Status};
use super::queue::ApprovalQueue;
use super::store::Delivery;
use crate::config::{self, SlackLinks};
use crate::store::{now_ms, Call};

/// The configured channels.
#[derive(Debug, Default)]
pub struct Notifier {
    pub slack: Option<SlackWebhook>,
    pub mailer: Option<Mailer>,
}

impl Notifier {
    /// The channels `config` names; a webhook URL comes from the environment, never from
    /// the config file.
    pub fn from_config(config: &config::Approvals) -> Result<Self, NotifyError> {
        let slack = std::env::var(&config.slack_webhook_env)
            .ok()
            .filter(|url| !url.trim().is_empty())
            .map(|url| SlackWebhook::new(url.trim()))
            .transpose()?;
        let mailer = config.smtp.as_ref().map(Mailer::new).transpose()?;
        Ok(Self { slack, mailer })
    }

    /// Who is owed a notification for each round: (`slack`, "") and (`email`, address).
    pub fn recipients(&self, config: &config::Approvals) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if self.slack.is_some() {
            out.push(("slack", String::new()));
        }
        if self.mailer.is_some() {
            for approver in config.approvers.iter().filter(|a| a.contains('@')) {
                out.push(("email", approver.clone()));
            }
        }
        out
    }
}

/// Send what is due, recipient by recipient (see the module's doc on digests); failures
/// are rescheduled with backoff.
pub async fn deliver_due(queue: &ApprovalQueue) {
    let due = match queue.store.call(|s| s.due_deliveries(now_ms(), 256)).await {
        Ok(due) => due,
        Err(e) => {
            tracing::error!(error = %e, "reading the notification outbox failed");
            return;
        }
    };
    let mut groups: Vec<((String, String), Vec<Delivery>)> = Vec::new();
    for delivery in due {
        let key = (delivery.channel.clone(), delivery.recipient.clone());
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, rows)) => rows.push(delivery),
            None => groups.push((key, vec![delivery])),
        }
    }
    for ((channel, recipient), rows) in groups {
        deliver_to(queue, &channel, &recipient, rows).await;
    }
}

/// One recipient's due deliveries. Its rate limit is open (closed ones are not due): the
/// deliveries collected while it was closed go out as one digest; otherwise the oldest
/// goes out alone and the rest wait for the digest at the end of the window that opens.
async fn deliver_to(queue: &ApprovalQueue, channel: &str, recipient: &str, rows: Vec<Delivery>) {
    let window = queue.config.digest_window;
    let mut items = live(queue, rows).await;
    if items.is_empty() {
        return;
    }
    if window.is_zero() {
        for (delivery, approval) in items {
            send_one(queue, delivery, &approval).await;
        }
        return;
    }
    let (c, r) = (channel.to_owned(), recipient.to_owned());
    let state = match queue.store.call(move |s| s.recipient_state(&c, &r)).await {
        Ok(state) => state,
        Err(e) => {
            tracing::error!(error = %e, "reading a recipient's notification state failed");
            return;
        }
    };
    let sent = if state.collecting {
        // The digest is everything due for the recipient, not only what this pass read.
        let (c, r) = (channel.to_owned(), recipient.to_owned());
        if let Ok(all) = queue.store.call(move |s| s.due_for(&c, &r, now_ms())).await {
            items = live(queue, all).await;
        }
        send_digest(queue, channel, recipient, items).await
    } else {
        // The rest (if any) stay owed: the recipient is collecting from now on.
        let (first, approval) = items.remove(0);
        send_one(queue, first, &approval).await
    };
    if sent {
        let open_ms = now_ms() + window.as_millis() as i64;
        let (c, r) = (channel.to_owned(), recipient.to_owned());
        if let Err(e) = queue
            .store
            .call(move |s| s.close_recipient(&c, &r, open_ms))
            .await
        {
            tracing::error!(error = %e, "storing a recipient's notification state failed");
        }
    }
}

/// The deliveries whose approval still waits for a decision, with it; the others are
/// dropped (a late "please decide" would only confuse).
async fn live(queue: &ApprovalQueue, rows: Vec<Delivery>) -> Vec<(Delivery, Approval)> {
    let mut out = Vec::with_capacity(rows.len());
    for delivery in rows {
        match queue.get(&delivery.approval_id).await {
            Ok(Some(approval)) if approval.status == Status::Pending => {
                out.push((delivery, approval))
            }
            Ok(_) => {
                let id = delivery.id;
                let _ = queue
                    .store
                    .call(move |s| s.delivery_dropped(id, now_ms()))
                    .await;
                queue
                    .metrics()
                    .approval_notification(&delivery.channel, "dropped");
            }
            Err(e) => tracing::error!(error = %e, "reading an approval to notify failed"),
        }
    }
    out
}

/// The review links a Slack message may carry for `approval`.
fn slack_links(queue: &ApprovalQueue, approval: &Approval) -> Vec<(String, String)> {
    match queue.config.slack_links {
        SlackLinks::Shared => queue.links(approval),
        SlackLinks::None => Vec::new(),
    }
}

/// Send one delivery on its own; whether it went through.
async fn send_one(queue: &ApprovalQueue, delivery: Delivery, approval: &Approval) -> bool {
    let kind = if delivery.round > 1 {
        NoticeKind::Reminder
    } else {
        NoticeKind::New
    };
    let sent = match delivery.channel.as_str() {
        "slack" => match &queue.notifier.slack {
            Some(slack) => {
                let links = slack_links(queue, approval);
                let notice = Notice {
                    approval,
                    kind,
                    links: &links,
                };
                slack.send(&message::slack_payload(&notice)).await
            }
            None => Err(NotifyError::Config("slack is not configured".into())),
        },
        "email" => match &queue.notifier.mailer {
            Some(mailer) => {
                let link = queue.link(approval, &delivery.recipient);
                let links = vec![(delivery.recipient.clone(), link.clone())];
                let notice = Notice {
                    approval,
                    kind,
                    links: &links,
                };
                mailer
                    .send(
                        &delivery.recipient,
                        &message::subject(&notice),
                        &message::email_text(&notice, &link),
                        &message::email_html(&notice, &link),
                    )
                    .await
            }
            None => Err(NotifyError::Config("email is not configured".into())),
        },
        _ => Err(NotifyError::Config("unknown channel".into())),
    };
    settle(
        queue,
        &delivery.channel,
        std::slice::from_ref(&delivery),
        sent,
    )
    .await
}

/// Send the deliveries of one recipient as a digest (several messages past
/// [`digest::MAX_ITEMS`] approvals); whether all of it went through.
async fn send_digest(
    queue: &ApprovalQueue,
    channel: &str,
    recipient: &str,
    items: Vec<(Delivery, Approval)>,
) -> bool {
    // One entry per approval: a first notice and a reminder of it both due are one item.
    let mut listed: Vec<(Vec<Delivery>, Approval)> = Vec::new();
    for (delivery, approval) in items {
        match listed.iter_mut().find(|(_, a)| a.id == approval.id) {
            Some((rows, _)) => rows.push(delivery),
            None => listed.push((vec![delivery], approval)),
        }
    }
    if listed.is_empty() {
        // All decided meanwhile: nothing was sent, so the recipient stays open.
        return false;
    }
    if let [(rows, approval)] = listed.as_mut_slice() {
        // A digest of one is just a notice.
        let first = rows.remove(0);
        let rest = std::mem::take(rows);
        let ok = send_one(queue, first, approval).await;
        if ok && !rest.is_empty() {
            settle(queue, channel, &rest, Ok(())).await;
        }
        return ok;
    }
    let total = listed.len();
    let mut all = true;
    for chunk in listed.chunks(digest::MAX_ITEMS) {
        let links: Vec<Vec<(String, String)>> = chunk
            .iter()
            .map(|(_, a)| match channel {
                "email" => vec![(recipient.to_owned(), queue.link(a, recipient))],
                _ => slack_links(queue, a),
            })
            .collect();
        let notices: Vec<Notice> = chunk
            .iter()
            .zip(&links)
            .map(|((rows, approval), links)| Notice {
                approval,
                kind: if rows.iter().any(|d| d.round == 1) {
                    NoticeKind::New
                } else {
                    NoticeKind::Reminder
                },
                links,
            })
            .collect();
        let d = Digest {
            notices: &notices,
            window: queue.config.digest_window,
            total,
        };
        let sent = match channel {
            "slack" => match &queue.notifier.slack {
                Some(slack) => slack.send(&digest::slack_payload(&d)).await,
                None => Err(NotifyError::Config("slack is not configured".into())),
            },
            "email" => match &queue.notifier.mailer {
                Some(mailer) => {
                    mailer
                        .send(
                            recipient,
                            &digest::subject(&d),
                            &digest::email_text(&d),
                            &digest::email_html(&d),
                        )
                        .await
                }
                None => Err(NotifyError::Config("email is not configured".into())),
            },
            _ => Err(NotifyError::Config("unknown channel".into())),
        };
        let rows: Vec<Delivery> = chunk.iter().flat_map(|(r, _)| r.clone()).collect();
        if sent.is_ok() {
            queue.metrics().approval_notification(channel, "digest");
        }
        all &= settle(queue, channel, &rows, sent).await;
    }
    all
}

/// Record what one message did for the deliveries it carried.
async fn settle(
    queue: &ApprovalQueue,
    channel: &str,
    rows: &[Delivery],
    sent: Result<(), NotifyError>,
) -> bool {
    let metrics = queue.metrics();
    match sent {
        Ok(()) => {
            metrics.approval_notification(channel, "sent");
            let ids: Vec<i64> = rows.iter().map(|d| d.id).collect();
            let _ = queue
                .store
                .call(move |s| {
                    let now = now_ms();
                    ids.iter().try_for_each(|id| s.delivered(*id, now))
                })
                .await;
            true
        }
        Err(e) => {
            metrics.approval_notification(channel, "failed");
            for delivery in rows {
                let wait = backoff(&queue.config, delivery.attempts);
                tracing::warn!(
                    approval = %delivery.approval_id,
                    channel = %delivery.channel,
                    attempts = delivery.attempts + 1,
                    retry_in = ?wait,
                    error = %e,
                    "notifying approvers failed; will retry"
                );
                let (id, error) = (delivery.id, e.to_string());
                let next = now_ms() + wait.as_millis() as i64;
                let _ = queue
                    .store
                    .call(move |s| s.delivery_failed(id, &error, next))
                    .await;
            }
            false
        }
    }
}

/// `retry_initial · 2^attempts`, at most `retry_max`.
fn backoff(config: &config::Approvals, attempts: u32) -> Duration {
    config
        .retry_initial
        .saturating_mul(1u32 << attempts.min(20))
        .min(config.retry_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let config = config::Approvals::default();
        assert_eq!(backoff(&config, 0), Duration::from_secs(1));
        assert_eq!(backoff(&config, 3), Duration::from_secs(8));
        assert_eq!(backoff(&config, 40), Duration::from_secs(300));
    }
}
