//! A real SMTP server for end-to-end tests, which keeps every mail it accepts.
//!
//! The approval tests must read the mail an approver would get and follow the link in it,
//! so the proxy's real mailer (lettre over TCP) has to talk to something that speaks SMTP
//! for real. [`SmtpSink`] binds `127.0.0.1:0` and speaks as much of RFC 5321 as a client
//! needs (EHLO/HELO, MAIL, RCPT, DATA with dot-unstuffing, RSET, NOOP, QUIT; no STARTTLS,
//! no AUTH), then decodes each message's MIME (multipart/alternative, quoted-printable,
//! base64) so tests can assert on the text a human would read. [`SmtpSink::set_down`]
//! turns it into a relay that refuses every connection with `421`, to test retries.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mailparse::{MailHeaderMap, ParsedMail};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

/// Longest command or data line accepted (RFC 5321 says 1000 with CRLF; lettre keeps to it,
/// and a runaway client must not eat the test's memory).
const MAX_LINE: u64 = 64 * 1024;

/// One accepted mail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mail {
    /// The envelope sender (`MAIL FROM`), without the angle brackets.
    pub from: String,
    /// The envelope recipients (`RCPT TO`).
    pub to: Vec<String>,
    /// The message as received, dot-unstuffed, CRLF line ends.
    pub raw: String,
    /// The decoded `Subject` header; empty when absent.
    pub subject: String,
    /// The decoded first `text/plain` part; empty when there is none.
    pub text: String,
    /// The decoded first `text/html` part; empty when there is none.
    pub html: String,
}

impl Mail {
    fn new(from: String, to: Vec<String>, raw: String) -> Self {
        let mut mail = Mail {
            from,
            to,
            raw,
            subject: String::new(),
            text: String::new(),
            html: String::new(),
        };
        // A message that does not parse is still kept raw: the test then sees why.
        if let Ok(parsed) = mailparse::parse_mail(mail.raw.as_bytes()) {
            mail.subject = parsed
                .headers
                .get_first_value("Subject")
                .unwrap_or_default();
            mail.text = first_part(&parsed, "text/plain").unwrap_or_default();
            mail.html = first_part(&parsed, "text/html").unwrap_or_default();
        }
        mail
    }

    /// The value of the first header `name` (case-insensitive), decoded.
    pub fn header(&self, name: &str) -> Option<String> {
        mailparse::parse_mail(self.raw.as_bytes())
            .ok()?
            .headers
            .get_first_value(name)
    }

    /// Every `http://` or `https://` URL in the plain-text part, in order, so a test can
    /// follow the link an approver would click.
    pub fn links(&self) -> Vec<String> {
        links_in(&self.text)
    }
}

/// The URLs in `text`: from `http(s)://` to the next whitespace, `"`, `<` or `>`.
pub fn links_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = ["https://", "http://"]
        .iter()
        .filter_map(|p| rest.find(p))
        .min()
    {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '<' | '>'))
            .unwrap_or(tail.len());
        out.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// The body of the first part of `mimetype`, depth first, transfer encoding and charset
/// decoded.
fn first_part(mail: &ParsedMail, mimetype: &str) -> Option<String> {
    if mail.subparts.is_empty() {
        if mail.ctype.mimetype.eq_ignore_ascii_case(mimetype) {
            return mail.get_body().ok();
        }
        return None;
    }
    mail.subparts.iter().find_map(|p| first_part(p, mimetype))
}

#[derive(Debug, Default)]
struct Shared {
    mails: Mutex<Vec<Mail>>,
    arrived: Notify,
    down: AtomicBool,
    /// Milliseconds the `250` after a message's data is held back (`hold_acceptance`).
    accept_delay_ms: AtomicU64,
    connections: AtomicUsize,
    refused: AtomicUsize,
}

impl Shared {
    fn mails(&self) -> MutexGuard<'_, Vec<Mail>> {
        // A test that panicked while holding the lock must not hide the mails from the next.
        self.mails.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running SMTP sink; it stops accepting when dropped.
#[derive(Debug)]
pub struct SmtpSink {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

impl SmtpSink {
    /// Binds `127.0.0.1:0` and serves in the background of the current tokio runtime.
    /// Panics on failure: a test without its sink cannot say anything.
    pub async fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding the SMTP sink to 127.0.0.1:0");
        let addr = listener.local_addr().expect("the SMTP sink's address");
        let shared = Arc::new(Shared::default());
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(accept_loop(listener, shared.clone(), stop_rx));
        SmtpSink { addr, shared, stop }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `smtp://127.0.0.1:<port>`, as `approvals.smtp.url` takes it.
    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    /// Every mail accepted so far, in order.
    pub fn messages(&self) -> Vec<Mail> {
        self.shared.mails().clone()
    }

    /// The mails sent to `recipient` (an envelope recipient).
    pub fn messages_to(&self, recipient: &str) -> Vec<Mail> {
        self.shared
            .mails()
            .iter()
            .filter(|m| m.to.iter().any(|t| t.eq_ignore_ascii_case(recipient)))
            .cloned()
            .collect()
    }

    /// Forgets the mails accepted so far, between phases of a test.
    pub fn clear(&self) {
        self.shared.mails().clear();
    }

    /// Waits until at least `n` mails arrived or `timeout` (wall-clock, so a paused tokio
    /// clock cannot cut it short) passed, and returns all mails so far either way: the
    /// caller asserts on the count.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Mail> {
        let deadline = Instant::now() + timeout;
        loop {
            let arrived = self.shared.arrived.notified();
            let mails = self.messages();
            if mails.len() >= n || Instant::now() >= deadline {
                return mails;
            }
            tokio::select! {
                _ = arrived => {}
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    }

    /// `true`: every new connection is answered `421` and closed, as a relay that is down
    /// for maintenance does. `false`: back to normal.
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
    }

    /// Hold the `250` that accepts a message's data back by `delay`, after the message is
    /// kept (and seen by `wait_for`): the window in which the sender has handed a message
    /// over but not yet heard that it was taken.
    pub fn hold_acceptance(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.shared.accept_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// TCP connections accepted so far, refused ones included.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Connections answered `421` while down: how often a client tried and failed.
    pub fn refused(&self) -> usize {
        self.shared.refused.load(Ordering::SeqCst)
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _peer)) = accepted else {
            continue;
        };
        shared.connections.fetch_add(1, Ordering::SeqCst);
        let shared = shared.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {}
                result = session(stream, &shared) => {
                    if let Err(e) = result {
                        eprintln!("smtp sink: session ended: {e}");
                    }
                }
            }
        });
    }
}

/// One SMTP session, RFC 5321 §4.1 minus what a sink does not need.
async fn session(stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    if shared.down.load(Ordering::SeqCst) {
        shared.refused.fetch_add(1, Ordering::SeqCst);
        write
            .write_all(b"421 4.3.2 127.0.0.1 service not available\r\n")
            .await?;
        return write.shutdown().await;
    }
    let mut read = BufReader::new(read);
    write
        .write_all(b"220 127.0.0.1 ESMTP ostiary-e2e sink\r\n")
        .await?;
    let mut from: Option<String> = None;
    let mut to: Vec<String> = Vec::new();
    loop {
        let Some(line) = read_line(&mut read).await? else {
            return Ok(());
        };
        let line = String::from_utf8_lossy(&line).into_owned();
        let upper = line.to_ascii_uppercase();
        let verb = upper.split_whitespace().next().unwrap_or_default();
        let reply: &[u8] = match verb {
            "EHLO" => {
                from = None;
                to.clear();
                b"250-127.0.0.1 hello\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE 10485760\r\n"
            }
            "HELO" => {
                from = None;
                to.clear();
                b"250 127.0.0.1 hello\r\n"
            }
            "MAIL" if upper.starts_with("MAIL FROM:") => match path(&line["MAIL FROM:".len()..]) {
                Some(addr) => {
                    from = Some(addr);
                    to.clear();
                    b"250 2.1.0 OK\r\n"
                }
                None => b"501 5.1.7 bad sender address syntax\r\n",
            },
            "RCPT" if upper.starts_with("RCPT TO:") => {
                match (&from, path(&line["RCPT TO:".len()..])) {
                    (None, _) => b"503 5.5.1 MAIL first\r\n",
                    (Some(_), Some(addr)) if !addr.is_empty() => {
                        to.push(addr);
                        b"250 2.1.5 OK\r\n"
                    }
                    _ => b"501 5.1.3 bad recipient address syntax\r\n",
                }
            }
            "DATA" => {
                if from.is_none() || to.is_empty() {
                    b"503 5.5.1 MAIL and RCPT first\r\n"
                } else {
                    write
                        .write_all(b"354 end data with <CR><LF>.<CR><LF>\r\n")
                        .await?;
                    let Some(raw) = read_data(&mut read).await? else {
                        return Ok(());
                    };
                    let mail = Mail::new(
                        from.take().unwrap_or_default(),
                        std::mem::take(&mut to),
                        raw,
                    );
                    shared.mails().push(mail);
                    shared.arrived.notify_waiters();
                    let delay = shared.accept_delay_ms.load(Ordering::SeqCst);
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    b"250 2.0.0 OK queued\r\n"
                }
            }
            "RSET" => {
                from = None;
                to.clear();
                b"250 2.0.0 OK\r\n"
            }
            "NOOP" => b"250 2.0.0 OK\r\n",
            "VRFY" => b"252 2.1.5 cannot verify, will accept\r\n",
            "QUIT" => {
                write.write_all(b"221 2.0.0 bye\r\n").await?;
                return write.shutdown().await;
            }
            _ => b"502 5.5.2 command not recognized\r\n",
        };
        write.write_all(reply).await?;
    }
}

/// The address of `<addr> [params]` (angle brackets optional, params ignored); `<>` is the
/// null sender and gives an empty string.
fn path(arg: &str) -> Option<String> {
    let arg = arg.trim_start();
    if let Some(rest) = arg.strip_prefix('<') {
        let end = rest.find('>')?;
        return Some(rest[..end].to_owned());
    }
    arg.split_whitespace().next().map(str::to_owned)
}

/// One line without its CRLF (or bare LF); `None` at end of stream.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(
    read: &mut R,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = read.take(MAX_LINE).read_until(b'\n', &mut line).await?;
    if n == 0 {
        return Ok(None);
    }
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    Ok(Some(line))
}

/// The message after `354`, up to the line holding a single `.`, with the leading dot that
/// the client added to lines starting with one removed (RFC 5321 §4.5.2).
async fn read_data<R: tokio::io::AsyncBufRead + Unpin>(
    read: &mut R,
) -> std::io::Result<Option<String>> {
    let mut message = Vec::new();
    loop {
        let Some(line) = read_line(read).await? else {
            return Ok(None);
        };
        if line == b"." {
            return Ok(Some(String::from_utf8_lossy(&message).into_owned()));
        }
        let line = line.strip_prefix(b".").unwrap_or(&line);
        message.extend_from_slice(line);
        message.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_links() {
        assert_eq!(
            path("<a@b.test> BODY=8BITMIME").as_deref(),
            Some("a@b.test")
        );
        assert_eq!(path(" <>").as_deref(), Some(""));
        assert_eq!(path("a@b.test").as_deref(), Some("a@b.test"));
        assert_eq!(
            links_in("see http://127.0.0.1:1/approve/x\nand <https://y.test/z>"),
            vec!["http://127.0.0.1:1/approve/x", "https://y.test/z"]
        );
    }
}
