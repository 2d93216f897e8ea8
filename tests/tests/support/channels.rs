//! Helpers shared by the approval-channel test crates (`approvals_channels.rs`: email and
//! links; `approvals_notify.rs`: Slack, reminders, failing channels): approvers, a plain
//! client for the control listener, reading mail links, metrics.
#![allow(dead_code)]

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ostiary_e2e::smtp::{Mail, SmtpSink};

use crate::support::approvals::Rig;

pub(crate) const ALICE: &str = "alice@example.com";
pub(crate) const BOB: &str = "bob@example.com";
/// How long a stand-in is waited on for a notification (a bound, never asserted).
pub(crate) const WAIT: Duration = Duration::from_secs(15);

/// The `[approvals]` body: alice and bob, mail through `sink`, a quick clock, and `extra`.
/// Every notification goes out on its own (`digest_window = "0s"`): these tests follow one
/// approval's mail; batching is `approvals_bounds.rs`'s.
pub(crate) fn mail_config(sink: &SmtpSink, extra: &str) -> String {
    format!(
        "approvers = [\"{ALICE}\", \"{BOB}\"]\n\
         smtp = {{ url = \"{}\", from = \"ostiary@example.com\" }}\n\
         digest_window = \"0s\"\n\
         {extra}\n",
        sink.url()
    )
}

/// A name for an environment variable no other test uses.
pub(crate) fn unique_env(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "OSTIARY_TEST_{prefix}_{:x}{:x}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

/// A plain HTTP client for the control listener (never through the proxy).
pub(crate) fn web() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Status and body of a response.
pub(crate) async fn read(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

pub(crate) async fn get(url: &str) -> (u16, String) {
    read(web().get(url).send().await.unwrap()).await
}

pub(crate) async fn head(url: &str) -> (u16, String) {
    read(web().head(url).send().await.unwrap()).await
}

/// What the review page's form posts.
pub(crate) async fn post_form(url: &str, form: &str) -> (u16, String) {
    read(
        web()
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(form.to_owned())
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// The review links (`/approve/<token>`) in a mail's plain text.
pub(crate) fn review_links(mail: &Mail) -> Vec<String> {
    mail.links()
        .into_iter()
        .filter(|l| l.contains("/approve/"))
        .collect()
}

/// The one review link of the one mail `to` got (asserting there is exactly one of each).
pub(crate) fn only_link(sink: &SmtpSink, to: &str) -> String {
    let mails = sink.messages_to(to);
    assert_eq!(mails.len(), 1, "mails to {to}: {mails:#?}");
    let links = review_links(&mails[0]);
    assert_eq!(links.len(), 1, "{}", mails[0].text);
    links[0].clone()
}

/// The approval's status as the control API reports it.
pub(crate) async fn status_of(rig: &Rig, id: &str) -> String {
    let a = rig.proxy.control().approval(id).await.unwrap();
    a["status"].as_str().unwrap().to_owned()
}

/// `/metrics`, as text.
pub(crate) async fn metrics(rig: &Rig) -> String {
    let url = format!("http://{}/metrics", rig.proxy.control_addr);
    let request = web().get(url).bearer_auth(&rig.proxy.admin_token);
    let (status, text) = read(request.send().await.unwrap()).await;
    assert_eq!(status, 200);
    text
}

/// The value of series `name` whose labels include every `labels` pair; 0 when absent.
pub(crate) fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (series_name, series_labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let has = |(k, v): &(&str, &str)| {
            series_labels
                .split(',')
                .any(|pair| pair == format!("{k}=\"{v}\""))
        };
        if labels.iter().all(has) {
            return value.parse().unwrap();
        }
    }
    0.0
}

/// Poll `/metrics` until `check` holds (bounded; the failure shows the last text).
pub(crate) async fn wait_metrics(rig: &Rig, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = metrics(rig).await;
        if check(&text) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "metrics never showed {what}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
