//! A real browser on the approval page: Debian's headless Chromium driven by Playwright
//! (`tests/scripts/review_page.py`).
//!
//! The approval page is where a human decides whether an agent's irreversible action runs,
//! so its tests look at it as a person would: the text as Chromium renders it (after HTML
//! parsing, with the page's own CSP in force), and a click on a real submit button that
//! makes the browser POST the form. A string search in the HTML could not tell an escaped
//! `<script>` from a live one, nor whether `form-action 'self'` blocks the page's own form.
//!
//! The script runs with [`crate::clients::python_bin`] (the venv `scripts/test.sh` builds,
//! which pins `playwright`) and the browser at `$OSTIARY_CHROMIUM`, else
//! `/usr/bin/chromium`; Playwright's own browser download is never used. One visit takes
//! about two seconds, most of it Chromium starting.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::clients::{self, CmdOutput};

/// How long one visit (start Chromium, load, optionally click and load again) may take.
pub const BROWSER_TIMEOUT: Duration = Duration::from_secs(60);

/// What the browser showed. Element texts are `None` when the page has no such element
/// (a decided approval has no form; an error page has none of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageVisit {
    /// HTTP status of the page load.
    pub http_status: Option<u16>,
    /// Rendered text of `#tool`, `#destination`, `#args`, `#agent`, `#status`.
    pub tool: Option<String>,
    pub destination: Option<String>,
    pub args: Option<String>,
    pub agent: Option<String>,
    pub status: Option<String>,
    /// The whole body's rendered text.
    pub text: String,
    /// After clicking: the body text of the page the form's POST led to.
    pub after_click: Option<String>,
    /// After clicking: the HTTP status of that page.
    pub after_click_status: Option<u16>,
}

/// The Playwright script.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/review_page.py")
}

/// Opens `url` in headless Chromium and reads the page; with `click` (`"approve"` or
/// `"deny"`) then clicks that button and reads the page the form's POST returns.
pub async fn review_in_browser(url: &str, click: Option<&str>) -> Result<PageVisit, String> {
    review_in_browser_with(url, click, None).await
}

/// As [`review_in_browser`], typing `reason` into the form's reason box before clicking.
pub async fn review_in_browser_with(
    url: &str,
    click: Option<&str>,
    reason: Option<&str>,
) -> Result<PageVisit, String> {
    let script = script();
    let script = script
        .to_str()
        .ok_or_else(|| format!("script path is not UTF-8: {}", script.display()))?
        .to_owned();
    let mut args = vec![script, url.to_owned()];
    if let Some(button) = click {
        if !matches!(button, "approve" | "deny") {
            return Err(format!("click must be approve or deny, not {button:?}"));
        }
        args.extend(["--click".to_owned(), button.to_owned()]);
    }
    if let Some(reason) = reason {
        args.extend(["--reason".to_owned(), reason.to_owned()]);
    }
    // Unbuffered so a killed visit still shows what it printed; no .pyc in the tree.
    let env = [("PYTHONUNBUFFERED", "1"), ("PYTHONDONTWRITEBYTECODE", "1")];
    let out = clients::run(clients::python_bin(), &args, &env, BROWSER_TIMEOUT).await;
    if !out.success() {
        return Err(format!("browser visit of {url} failed: {out}"));
    }
    parse(&out)
}

fn parse(out: &CmdOutput) -> Result<PageVisit, String> {
    let line = out
        .stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let v: Value = serde_json::from_str(line)
        .map_err(|e| format!("review_page.py printed no JSON ({e}): {out}"))?;
    let text = |key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let status = |key: &str| {
        v.get(key)
            .and_then(Value::as_u64)
            .and_then(|s| u16::try_from(s).ok())
    };
    Ok(PageVisit {
        http_status: status("http_status"),
        tool: text("tool"),
        destination: text("destination"),
        args: text("args"),
        agent: text("agent"),
        status: text("status"),
        text: text("text").ok_or_else(|| format!("no page text in: {out}"))?,
        after_click: text("after_click"),
        after_click_status: status("after_click_status"),
    })
}
