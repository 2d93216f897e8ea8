//! One test per runtime guide (docs/guides/): each runs its guide's marked blocks with the
//! real program against the real proxy, through the harness of the parent module, and checks
//! what the upstream received and what the program printed.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_guide_runs() {
    let guide = Guide::load("shell.md");
    let (upstream, server, work) = example_api(Some(&guide)).await;
    let session = session_env(&server, work.path()).await;
    let api = [api_url(&upstream)];

    let out = run_block(work.path(), &guide.block("curl"), &with(&session, &api)).await;
    assert!(out.success(), "{out}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    let echo: Value = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(echo["query"], "from=shell", "{out}");
    assert!(
        echo["headers"].get("proxy-authorization").is_none(),
        "{out}"
    );
    let denied: Value = serde_json::from_str(lines[1]).unwrap_or_else(|e| panic!("{e}:\n{out}"));
    assert_eq!(denied["error"], "denied", "{out}");
    assert_eq!(
        denied["policies"],
        serde_json::json!(["example-api-no-deletes"])
    );
    assert_eq!(lines[2], "status 403", "{out}");
    assert!(
        out.stderr.contains("CONNECT tunnel failed, response 403"),
        "{out}"
    );
    assert_eq!(line(&out, "curl exit"), "curl exit 56", "{out}");
    assert_eq!(echoes(&upstream, "?from=shell"), 1);
    assert_eq!(upstream.seen().len(), 1, "the DELETE was not forwarded");

    let (out, id) = run_with_approval(
        &server,
        work.path(),
        &guide.block("approval"),
        &with(&session, &api),
    )
    .await;
    assert!(out.success(), "{out}");
    let held = line(&out, "status 202: ");
    let held: Value = serde_json::from_str(&held["status 202: ".len()..]).unwrap();
    assert_eq!(held["error"], "approval_pending");
    assert_eq!(held["approval_id"], id.as_str());
    assert_eq!(
        line(&out, "status 201: "),
        "status 201: {\"stored\":1}",
        "{out}"
    );
    let stored = upstream.messages();
    assert_eq!(stored.len(), 1, "sent once: {stored:?}");
    assert_eq!(
        stored[0]["body"],
        "{\"to\": \"ops\", \"text\": \"deploy finished\"}"
    );

    // `ostiary run` makes a session of its own: only PATH, the config and API_URL given.
    let env = with(&ostiary_env(&server), &api);
    let out = run_block(work.path(), &guide.block("run"), &env).await;
    assert!(out.success(), "{out}");
    let echo: Value = serde_json::from_str(line(&out, "{")).unwrap();
    assert_eq!(echo["query"], "from=run", "{out}");
    assert_eq!(line(&out, "exit "), "exit 0", "{out}");
    assert_eq!(echoes(&upstream, "?from=run"), 1);
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_requests_httpx_guide_runs() {
    let guide = Guide::load("python-requests-httpx.md");
    let (upstream, server, work) = example_api(Some(&guide)).await;
    let session = session_env(&server, work.path()).await;
    let env = with(&session, &[api_url(&upstream)]);

    let out = run_block(work.path(), &guide.block("requests"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "allowed"), "allowed 200 None", "{out}");
    assert_eq!(
        line(&out, "denied"),
        "denied 403 denied ['example-api-no-deletes']",
        "{out}"
    );
    assert_eq!(line(&out, "refused"), "refused at CONNECT: True", "{out}");
    assert_eq!(echoes(&upstream, "?from=requests"), 1);
    let ua = upstream.seen_path("/echo")[0]
        .header("user-agent")
        .unwrap_or_default()
        .to_owned();
    assert!(ua.starts_with("python-requests/"), "{ua}");

    let (out, id) = run_with_approval(
        &server,
        work.path(),
        &guide.block("requests-approval"),
        &env,
    )
    .await;
    assert!(out.success(), "{out}");
    assert!(
        line(&out, "held").starts_with(&format!("held approval_pending {id} http://")),
        "{out}"
    );
    assert_eq!(line(&out, "answer"), "answer 201 {'stored': 1}", "{out}");
    assert_eq!(upstream.messages().len(), 1, "sent once");

    let out = run_block(work.path(), &guide.block("httpx"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "allowed"), "allowed 200 None", "{out}");
    assert_eq!(
        line(&out, "denied"),
        "denied 403 True ['example-api-no-deletes']",
        "{out}"
    );
    assert!(
        line(&out, "held").starts_with("held 202 approval_pending apr_"),
        "{out}"
    );
    assert_eq!(
        line(&out, "refused"),
        "refused at CONNECT: 403 Forbidden",
        "{out}"
    );
    assert_eq!(echoes(&upstream, "?from=httpx"), 1);
    assert_eq!(upstream.messages().len(), 1, "the held one is not sent");
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_anthropic_guide_runs() {
    let guide = Guide::load("openai-anthropic.md");
    let names = ["api.openai.test", "api.anthropic.test"];
    let upstream = Upstream::builder().names(&names).start().await;
    let (policies, tools) = policies_and_tools(Some(&guide));
    let server = start_proxy(ProxySetup {
        upstream_ca: upstream.ca(),
        ports: vec![upstream.port()],
        names: &names,
        policies,
        tools,
        extra_toml: for_test(&guide.block("credentials").code),
    })
    .await;
    let work = tempfile::tempdir().unwrap();
    let session = session_env(&server, work.path()).await;
    let placeholders: BTreeMap<_, _> = session.iter().cloned().collect();
    assert_eq!(
        placeholders.get("OPENAI_API_KEY").map(String::as_str),
        Some("ostiary:openai")
    );
    assert_eq!(
        placeholders.get("ANTHROPIC_API_KEY").map(String::as_str),
        Some("ostiary:anthropic")
    );
    let port = upstream.port();

    let env = with(
        &session,
        &[(
            "OPENAI_BASE_URL",
            format!("https://api.openai.test:{port}/v1"),
        )],
    );
    let out = run_block(work.path(), &guide.block("openai"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "allowed"),
        "allowed Hello from the stand-in.",
        "{out}"
    );
    assert_eq!(
        line(&out, "denied"),
        "denied 403 denied ['llm-no-preview-models']",
        "{out}"
    );
    let chats = upstream.seen_path("/v1/chat/completions");
    assert_eq!(chats.len(), 1, "the denied call was not forwarded");
    assert_eq!(
        chats[0].header("authorization"),
        Some(format!("Bearer {OPENAI_SECRET}").as_str()),
        "the proxy wrote the real key over the placeholder"
    );
    assert_eq!(chats[0].sni.as_deref(), Some("api.openai.test"));

    let env = with(
        &session,
        &[(
            "ANTHROPIC_BASE_URL",
            format!("https://api.anthropic.test:{port}"),
        )],
    );
    let (out, id) = run_with_approval(&server, work.path(), &guide.block("anthropic"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "allowed"),
        "allowed Hello from the stand-in.",
        "{out}"
    );
    assert_eq!(
        line(&out, "held"),
        format!("held approval_pending {id}"),
        "{out}"
    );
    assert_eq!(
        line(&out, "approved"),
        "approved Hello from the stand-in.",
        "{out}"
    );
    let messages = upstream.seen_path("/v1/messages");
    assert_eq!(
        messages.len(),
        2,
        "haiku, then opus once after the approval"
    );
    for m in &messages {
        assert_eq!(
            m.header("authorization"),
            Some(format!("Bearer {ANTHROPIC_SECRET}").as_str()),
            "{m:?}"
        );
        assert!(m.header("proxy-authorization").is_none());
    }
    assert!(!out.stdout.contains(OPENAI_SECRET) && !out.stdout.contains(ANTHROPIC_SECRET));
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_guide_runs() {
    let guide = Guide::load("mcp.md");
    let ca = TestCa::new();
    let mcp = PyTlsServer::start(&ca, &["files.example.test"], "mcp_server.py", |_| {
        Vec::new()
    })
    .await;
    let url = format!("https://files.example.test:{}/mcp", mcp.port);
    let (policies, tools) = policies_and_tools(Some(&guide));
    let tools = tools.replace("https://files.example.test/mcp", &url);
    let server = start_proxy(ProxySetup {
        upstream_ca: &ca,
        ports: vec![mcp.port],
        names: &["files.example.test"],
        policies,
        tools,
        extra_toml: String::new(),
    })
    .await;
    let work = tempfile::tempdir().unwrap();
    let session = session_env(&server, work.path()).await;
    let out = run_block(
        work.path(),
        &guide.block("client"),
        &with(&session, &[("MCP_URL", url)]),
    )
    .await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "tools"),
        "tools ['delete_file', 'read_file']",
        "{out}"
    );
    assert_eq!(line(&out, "read_file"), "read_file hello", "{out}");
    assert_eq!(
        line(&out, "write_file"),
        "write_file -32001 denied ['files-no-writes']",
        "{out}"
    );
    assert!(
        line(&out, "delete_file").starts_with("delete_file -32002 approval_pending apr_"),
        "{out}"
    );
    let records = audit_query(&server, &["--decision", "deny"], |r| {
        r.iter()
            .any(|r| r["policies"] == serde_json::json!(["files-no-writes"]))
    })
    .await;
    assert!(
        records
            .iter()
            .any(|r| r["policies"] == serde_json::json!(["files-no-writes"])),
        "{records:#?}"
    );
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_guide_runs() {
    let guide = Guide::load("node.md");
    let (upstream, server, work) = example_api(Some(&guide)).await;
    let session = session_env(&server, work.path()).await;
    let env = with(&session, &[api_url(&upstream)]);

    let out = run_block(work.path(), &guide.block("env-proxy-agent"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "allowed"),
        "allowed 200 (no proxy-authorization)",
        "{out}"
    );
    assert_eq!(
        line(&out, "denied"),
        "denied 403 denied [ 'example-api-no-deletes' ]",
        "{out}"
    );
    assert!(
        line(&out, "held").starts_with("held 202 approval_pending apr_"),
        "{out}"
    );
    assert_eq!(
        line(&out, "refused"),
        "refused at CONNECT: Proxy response (403) !== 200 when HTTP Tunneling",
        "{out}"
    );
    assert_eq!(echoes(&upstream, "?from=node"), 1);

    let out = run_block(work.path(), &guide.block("proxy-agent"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(
        line(&out, "allowed"),
        "allowed 200 from=proxy-agent",
        "{out}"
    );
    assert_eq!(echoes(&upstream, "?from=proxy-agent"), 1);
    assert_eq!(upstream.messages().len(), 0, "the held one is not sent");
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_guide_runs() {
    let guide = Guide::load("go.md");
    let (upstream, server, work) = example_api(Some(&guide)).await;
    let session = session_env(&server, work.path()).await;
    let env = with(&session, &[api_url(&upstream)]);

    let out = run_block(work.path(), &guide.block("net-http"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "allowed"), "allowed 200 true", "{out}");
    assert_eq!(
        line(&out, "denied"),
        "denied 403 denied [example-api-no-deletes]",
        "{out}"
    );
    assert_eq!(
        line(&out, "held"),
        "held 202 approval_pending true",
        "{out}"
    );
    assert_eq!(
        line(&out, "refused"),
        "refused at CONNECT: Get \"https://example.net/\": Forbidden",
        "{out}"
    );
    assert_eq!(echoes(&upstream, "?from=go"), 1);
    let ua = upstream.seen_path("/echo")[0]
        .header("user-agent")
        .unwrap_or_default()
        .to_owned();
    assert!(ua.starts_with("Go-http-client/"), "{ua}");

    let out = run_block(work.path(), &guide.block("transport"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "allowed"), "allowed 200", "{out}");
    assert_eq!(echoes(&upstream, "?from=go-transport"), 1);
    guide.all_taken();
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn git_guide_runs() {
    let guide = Guide::load("git.md");
    let repos = tempfile::tempdir().unwrap();
    make_repository(&repos.path().join("acme/widgets.git")).await;
    let upstream = Upstream::builder()
        .names(&["git.example.test"])
        .git_root(repos.path())
        .start()
        .await;
    let (policies, tools) = policies_and_tools(Some(&guide));
    let server = start_proxy(ProxySetup {
        upstream_ca: upstream.ca(),
        ports: vec![upstream.port()],
        names: &["git.example.test"],
        policies,
        tools,
        extra_toml: String::new(),
    })
    .await;
    let work = tempfile::tempdir().unwrap();
    let session = session_env(&server, work.path()).await;
    let repo_url = format!(
        "https://git.example.test:{}/git/acme/widgets.git",
        upstream.port()
    );
    let env = with(&session, &[("REPO_URL", repo_url.clone())]);

    let out = run_block(work.path(), &guide.block("clone"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(line(&out, "cloned"), "cloned first commit", "{out}");
    assert_eq!(line(&out, "<sha>"), "<sha>\trefs/heads/main", "{out}");
    assert!(work.path().join("widgets/README").is_file(), "{out}");

    let out = run_block(work.path(), &guide.block("config"), &env).await;
    assert!(out.success(), "{out}");
    assert_eq!(out.stdout.trim(), "1", "{out}");

    let out = run_block(work.path(), &guide.block("push"), &env).await;
    assert!(out.success(), "{out}");
    assert!(
        out.stdout.contains(&format!(
            "fatal: unable to access '{repo_url}/': The requested URL returned error: 403"
        )),
        "{out}"
    );
    assert_eq!(
        line(&out, "push refused"),
        "push refused (exit 128)",
        "{out}"
    );

    let seen = upstream.seen();
    assert!(
        seen.iter()
            .any(|s| s.path.ends_with("/info/refs?service=git-upload-pack")),
        "{seen:?}"
    );
    assert!(seen
        .iter()
        .any(|s| s.method == "POST" && s.path.ends_with("/git-upload-pack")));
    assert!(
        seen.iter()
            .all(|s| !s.path.contains("receive-pack") && s.header("proxy-authorization").is_none()),
        "nothing of the push reached the upstream: {seen:?}"
    );
    let denies = audit_query(&server, &["--decision", "deny"], |r| {
        r.iter()
            .any(|r| r["policies"] == serde_json::json!(["git-no-push"]))
    })
    .await;
    assert!(
        denies
            .iter()
            .any(|r| r["policies"] == serde_json::json!(["git-no-push"])),
        "{denies:#?}"
    );
    guide.all_taken();
    server.stop().await;
}

/// A bare repository at `bare` with one commit (`first commit`, a README) on `main`.
async fn make_repository(bare: &Path) {
    let src = tempfile::tempdir().unwrap();
    let src_path = src.path().display().to_string();
    let bare_path = bare.display().to_string();
    let git = |args: Vec<String>| async move {
        let env = [
            ("GIT_AUTHOR_NAME".to_owned(), "guide".to_owned()),
            (
                "GIT_AUTHOR_EMAIL".to_owned(),
                "guide@example.test".to_owned(),
            ),
            ("GIT_COMMITTER_NAME".to_owned(), "guide".to_owned()),
            (
                "GIT_COMMITTER_EMAIL".to_owned(),
                "guide@example.test".to_owned(),
            ),
        ];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_in(Path::new("/"), "git", &args, &env).await;
        assert!(out.success(), "git {args:?}:\n{out}");
    };
    let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    git(s(&[
        "init",
        "--quiet",
        "--bare",
        "--initial-branch=main",
        &bare_path,
    ]))
    .await;
    git(s(&["init", "--quiet", "--initial-branch=main", &src_path])).await;
    std::fs::write(src.path().join("README"), "widgets\n").unwrap();
    git(s(&["-C", &src_path, "add", "README"])).await;
    git(s(&[
        "-C",
        &src_path,
        "commit",
        "--quiet",
        "-m",
        "first commit",
    ]))
    .await;
    git(s(&["-C", &src_path, "push", "--quiet", &bare_path, "main"])).await;
}
