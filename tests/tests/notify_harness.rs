//! Self-tests of the notification stand-ins: the SMTP sink receives a real lettre mail and
//! decodes it as a reader would see it, refuses connections while "down", and the Slack
//! receiver keeps posted JSON and fails on request. Then Ostiary's own `Mailer` and
//! `SlackWebhook` are driven through them, so an approval test that fails points at the
//! proxy, not at its stand-ins.

use std::time::Duration;

use lettre::message::{Mailbox, MultiPart};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use ostiary::approvals::notify::email::Mailer;
use ostiary::approvals::notify::message::NotifyError;
use ostiary::approvals::notify::slack::SlackWebhook;
use ostiary::config::Smtp;
use ostiary_e2e::slack::{button_urls, button_values, interaction_body, sign, SlackReceiver};
use ostiary_e2e::smtp::SmtpSink;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(10);

fn transport(sink: &SmtpSink) -> AsyncSmtpTransport<Tokio1Executor> {
    AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
        .port(sink.port())
        .timeout(Some(Duration::from_secs(5)))
        .build()
}

/// A mail whose text needs quoted-printable (a long line, some non-ASCII), whose HTML is
/// base64 (lettre picks it for mostly non-ASCII text), with a line starting with a dot
/// (dot-stuffing).
fn mail(to: &str) -> Message {
    let text = format!(
        ".leading dot\nCafé ✓ {}\nhttp://127.0.0.1:1/approve/tok\n",
        "long ".repeat(60)
    );
    let html = format!("<p>Café ✓</p><pre>{}</pre>", "✓".repeat(500));
    Message::builder()
        .from("Ostiary <ostiary@example.com>".parse::<Mailbox>().unwrap())
        .to(to.parse::<Mailbox>().unwrap())
        .subject("Approval needed: café ✓")
        .multipart(MultiPart::alternative_plain_html(text, html))
        .unwrap()
}

#[tokio::test]
async fn smtp_sink_receives_and_decodes_a_lettre_mail() {
    let sink = SmtpSink::start().await;
    assert_eq!(sink.url(), format!("smtp://127.0.0.1:{}", sink.port()));
    transport(&sink)
        .send(mail("alice@example.com"))
        .await
        .expect("sending through the sink");
    let mails = sink.wait_for(1, WAIT).await;
    assert_eq!(mails.len(), 1);
    let m = &mails[0];
    assert_eq!(m.from, "ostiary@example.com");
    assert_eq!(m.to, vec!["alice@example.com".to_owned()]);
    assert_eq!(m.subject, "Approval needed: café ✓");
    assert!(
        m.text.starts_with(".leading dot\r\nCafé ✓ long long"),
        "{:?}",
        m.text
    );
    assert!(m.text.contains(&"long ".repeat(60)), "{:?}", m.text);
    assert_eq!(m.links(), vec!["http://127.0.0.1:1/approve/tok"]);
    assert!(m.html.starts_with("<p>Café ✓</p><pre>✓✓✓"), "{:?}", m.html);
    assert!(m.html.contains(&"✓".repeat(500)));
    assert!(m.raw.contains("multipart/alternative"), "{}", m.raw);
    // Both transfer encodings were exercised, and the dot-stuffed line came back unstuffed.
    assert!(
        m.raw
            .contains("Content-Transfer-Encoding: quoted-printable"),
        "{}",
        m.raw
    );
    assert!(
        m.raw.contains("Content-Transfer-Encoding: base64"),
        "{}",
        m.raw
    );
    assert!(m.raw.contains("\r\n.leading dot\r\n"), "{}", m.raw);
    assert_eq!(m.header("To").as_deref(), Some("alice@example.com"));
    assert_eq!(sink.messages_to("ALICE@example.com").len(), 1);
}

#[tokio::test]
async fn smtp_sink_refuses_while_down_then_recovers() {
    let sink = SmtpSink::start().await;
    sink.set_down(true);
    let err = transport(&sink)
        .send(mail("bob@example.com"))
        .await
        .expect_err("a down relay refuses");
    assert!(
        err.to_string().contains("421") || err.is_permanent() || err.is_transient(),
        "{err}"
    );
    assert_eq!(sink.refused(), 1);
    assert!(sink.messages().is_empty());
    sink.set_down(false);
    transport(&sink)
        .send(mail("bob@example.com"))
        .await
        .unwrap();
    assert_eq!(sink.wait_for(1, WAIT).await.len(), 1);
    assert_eq!(sink.connections(), 2);
}

#[tokio::test]
async fn ostiary_mailer_sends_multipart_through_the_sink() {
    let sink = SmtpSink::start().await;
    let mailer = Mailer::new(&Smtp {
        url: sink.url(),
        from: "ostiary@example.com".to_owned(),
        username_env: None,
        password_env: None,
    })
    .unwrap();
    mailer
        .send(
            "carol@example.com",
            "Approval needed: refund",
            "plain body http://127.0.0.1:1/approve/abc",
            "<p>html &lt;script&gt; body</p>",
        )
        .await
        .unwrap();
    let mails = sink.wait_for(1, WAIT).await;
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].subject, "Approval needed: refund");
    assert_eq!(mails[0].to, vec!["carol@example.com".to_owned()]);
    assert_eq!(mails[0].links(), vec!["http://127.0.0.1:1/approve/abc"]);
    assert!(mails[0].html.contains("&lt;script&gt;"));

    sink.set_down(true);
    let err = mailer
        .send("carol@example.com", "s", "t", "<p>h</p>")
        .await
        .unwrap_err();
    assert!(matches!(err, NotifyError::Smtp(_)), "{err:?}");
}

#[tokio::test]
async fn slack_receiver_keeps_posts_and_fails_on_request() {
    let receiver = SlackReceiver::start().await;
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let message = json!({
        "text": "hello",
        "blocks": [{"type": "actions", "elements": [
            {"type": "button", "action_id": "approve", "value": "apr_1", "text": {"type": "plain_text", "text": "Approve"}},
            {"type": "button", "action_id": "review-0", "url": "http://127.0.0.1:1/approve/t", "text": {"type": "plain_text", "text": "Review"}}
        ]}]
    });
    let response = client
        .post(receiver.url())
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "ok");
    let got = receiver.wait_for(1, WAIT).await;
    assert_eq!(got, vec![message.clone()]);
    assert_eq!(button_urls(&got[0]), vec!["http://127.0.0.1:1/approve/t"]);
    assert_eq!(
        button_values(&got[0]),
        vec![("approve".to_owned(), "apr_1".to_owned())]
    );

    let bad = client
        .post(receiver.url())
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);

    receiver.fail_next(2);
    for _ in 0..2 {
        let r = client
            .post(receiver.url())
            .json(&message)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 500);
    }
    let r = client
        .post(receiver.url())
        .json(&message)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(receiver.messages().len(), 2);
    assert_eq!(receiver.attempts(), 5);
}

#[tokio::test]
async fn ostiary_webhook_posts_through_the_receiver() {
    let receiver = SlackReceiver::start().await;
    let hook = SlackWebhook::new(&receiver.url()).unwrap();
    receiver.fail_next(1);
    let err = hook.send(&json!({"text": "x"})).await.unwrap_err();
    assert!(
        matches!(err, NotifyError::SlackStatus { status: 500 }),
        "{err:?}"
    );
    hook.send(&json!({"text": "x"})).await.unwrap();
    assert_eq!(receiver.wait_for(1, WAIT).await, vec![json!({"text": "x"})]);
}

#[test]
fn signed_interaction_verifies_with_ostiary() {
    use ostiary::approvals::slack_callback::{parse, verify};
    use ostiary::approvals::Verdict;
    let body = interaction_body("deny", "apr_7", "U42");
    let signature = sign("shh", 1_700_000_000, &body);
    verify(
        b"shh",
        "1700000000",
        &signature,
        body.as_bytes(),
        1_700_000_100,
    )
    .unwrap();
    let action = parse(body.as_bytes()).unwrap();
    assert_eq!(action.verdict, Verdict::Deny);
    assert_eq!(action.approval_id, "apr_7");
    assert_eq!(action.user_id, "U42");
}
