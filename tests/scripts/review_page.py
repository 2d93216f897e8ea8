"""Opens an approval review page in headless Chromium and reports what a human would see.

The approval page is the one place where a person decides whether an agent's irreversible
action runs, so the tests check it in a real browser (Debian's Chromium driven through
Playwright), not by grepping HTML: what counts is the text as rendered, that the buttons are
real form submits, and that the page's security headers (CSP, form-action) do not block its
own form.

usage: review_page.py URL [--click approve|deny] [--reason TEXT]

Prints one JSON line on stdout:
  {"http_status": 200, "tool": ..., "destination": ..., "args": ..., "agent": ...,
   "status": ..., "text": <whole body text>,
   "after_click": <body text after the form's POST, or null>, "after_click_status": ...}
Element texts are null when the element is absent (a decided approval has no form).
Exits non-zero with a message on stderr when the page cannot be loaded or clicked.

The browser is `$OSTIARY_CHROMIUM` (default /usr/bin/chromium): Playwright's own browser
download is never used, since the test machines reach package registries only.
"""

import argparse
import json
import os
import sys

from playwright.sync_api import sync_playwright

IDS = ("tool", "destination", "args", "agent", "status")
# One step (load, or submit and load) may take this long; the Rust side kills the whole
# script after 60 s.
STEP_TIMEOUT_MS = 25_000


def text_of(page, element_id):
    element = page.query_selector(f"#{element_id}")
    return None if element is None else element.inner_text()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--click", choices=("approve", "deny"))
    parser.add_argument("--reason")
    opts = parser.parse_args()

    executable = os.environ.get("OSTIARY_CHROMIUM") or "/usr/bin/chromium"
    args = [
        # Tests talk to 127.0.0.1 only; no proxy from the machine's settings may interpose.
        "--no-proxy-server",
        # Containers give /dev/shm a few MiB, too little for Chromium's renderer.
        "--disable-dev-shm-usage",
    ]
    if os.geteuid() == 0:
        # Chromium refuses to start its sandbox as root; the page under test is our own.
        args.append("--no-sandbox")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=args)
        try:
            page = browser.new_page()
            page.set_default_timeout(STEP_TIMEOUT_MS)
            response = page.goto(opts.url, wait_until="load")
            out = {"http_status": None if response is None else response.status}
            for element_id in IDS:
                out[element_id] = text_of(page, element_id)
            out["text"] = page.inner_text("body")
            out["after_click"] = None
            out["after_click_status"] = None
            if opts.click:
                # Fail at once, not after Playwright's wait for an element that never comes.
                if page.query_selector(f"#{opts.click}") is None:
                    raise RuntimeError(f"the page has no #{opts.click} button")
                if opts.reason is not None:
                    page.fill("textarea[name=reason]", opts.reason)
                with page.expect_navigation(wait_until="load") as nav:
                    page.click(f"#{opts.click}")
                after = nav.value
                out["after_click_status"] = None if after is None else after.status
                out["after_click"] = page.inner_text("body")
        finally:
            browser.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one readable line for the Rust side's error
        print(f"review_page.py: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
