//! Telling approvers that something waits for them: a Slack message to the incoming
//! webhook's channel and one email per approver address.
//!
//! Notifications go through the store's outbox ([`super::store::ApprovalStore::enqueue`]):
//! the hold commits them together with the approval, and [`deliver_due`] sends what is due,
//! retrying failures with doubling backoff until they go through or the approval is decided.
//! A notification channel that is down never loses or blocks an approval; it shows on
//! `/metrics` (`ostiary_approval_notifications_failing`) and in `ostiary approvals show`.
//!
//! - [`message`] — what a notification says (from what the proxy observed).
//! - [`slack`] — the incoming-webhook client.
//! - [`email`] — SMTP with lettre.

pub mod email;
pub mod message;
pub mod slack;

use std::time::Duration;

use self::email::Mailer;
use self::message::{Notice, NoticeKind, NotifyError};
use self::slack::SlackWebhook;
use super::model::Status;
use super::queue::ApprovalQueue;
use super::store::Delivery;
use crate::config;
use crate::store::now_ms;

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

/// Send every notification that is due; failures are rescheduled with backoff.
pub async fn deliver_due(queue: &ApprovalQueue) {
    let due = match queue.store.call(|s| s.due_deliveries(now_ms(), 64)).await {
        Ok(due) => due,
        Err(e) => {
            tracing::error!(error = %e, "reading the notification outbox failed");
            return;
        }
    };
    for delivery in due {
        deliver(queue, delivery).await;
    }
}

async fn deliver(queue: &ApprovalQueue, delivery: Delivery) {
    let approval = match queue.get(&delivery.approval_id).await {
        Ok(Some(a)) => a,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(error = %e, "reading an approval to notify failed");
            return;
        }
    };
    let id = delivery.id;
    // Decided (or expired) meanwhile: a late "please decide" would only confuse.
    if approval.status != Status::Pending {
        let _ = queue
            .store
            .call(move |s| s.delivery_dropped(id, now_ms()))
            .await;
        queue
            .metrics()
            .approval_notification(&delivery.channel, "dropped");
        return;
    }
    let kind = if delivery.round > 1 {
        NoticeKind::Reminder
    } else {
        NoticeKind::New
    };
    let sent = match delivery.channel.as_str() {
        "slack" => match &queue.notifier.slack {
            Some(slack) => {
                let links = if queue.config.slack_links {
                    queue.links(&approval)
                } else {
                    Vec::new()
                };
                let notice = Notice {
                    approval: &approval,
                    kind,
                    links: &links,
                };
                slack.send(&message::slack_payload(&notice)).await
            }
            None => Err(NotifyError::Config("slack is not configured".into())),
        },
        "email" => match &queue.notifier.mailer {
            Some(mailer) => {
                let link = queue.link(&approval, &delivery.recipient);
                let links = vec![(delivery.recipient.clone(), link.clone())];
                let notice = Notice {
                    approval: &approval,
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
    let metrics = queue.metrics();
    match sent {
        Ok(()) => {
            metrics.approval_notification(&delivery.channel, "sent");
            let _ = queue.store.call(move |s| s.delivered(id, now_ms())).await;
        }
        Err(e) => {
            metrics.approval_notification(&delivery.channel, "failed");
            let wait = backoff(&queue.config, delivery.attempts);
            tracing::warn!(
                approval = %delivery.approval_id,
                channel = %delivery.channel,
                attempts = delivery.attempts + 1,
                retry_in = ?wait,
                error = %e,
                "notifying approvers failed; will retry"
            );
            let error = e.to_string();
            let next = now_ms() + wait.as_millis() as i64;
            let _ = queue
                .store
                .call(move |s| s.delivery_failed(id, &error, next))
                .await;
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
