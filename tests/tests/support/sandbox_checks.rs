//! The checks of `ostiary run --sandbox` tried as a hostile agent would (docs/sandbox.md),
//! each taking the profile it runs under, so that `sandbox.rs` runs them under the
//! `namespaces` level and `sandbox_gvisor.rs` under `gvisor`: the proxy is the only way out
//! (curl and Python `requests` work unchanged; direct TCP, UDP, DNS, abstract sockets do
//! not), the operator's secrets are out of sight, nothing written survives, and the command
//! runs as its own uid with no privileges and a seccomp filter.
//!
//! Directories are listed and modes read with `find`, the shell or Python, never with
//! coreutils' `ls PATH` or `stat`: under Debian's runsc (2022-12) their `statx` calls
//! (`AT_NO_AUTOMOUNT`) fail with `EINVAL`, and a check that printed nothing would pass.
#![allow(dead_code)]

use std::io::ErrorKind;
use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::sandbox::{line_value, own_uid, said, Rig, PYTHON, SYSTEM};

/// Makes `dir` enterable and `file` readable by every uid (tempfile makes them `0700` and
/// `0600`), so that only the sandbox's view can keep them from the command.
fn open_to_all(dir: &Path, file: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path, mode| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    mode(dir, 0o755);
    mode(file, 0o644);
}

pub(crate) async fn clients_reach_the_upstream(profile: &str) {
    let rig = Rig::start(None, "").await;
    let url = rig.upstream.url("/echo?from=sandbox");
    // Unchanged clients: no flag, no code for the proxy; only the environment says it.
    let script = format!(
        r#"curl -q -sS -w '\nCODE=%{{http_code}}\n' '{url}'
{PYTHON} -c 'import json, requests
r = requests.get("{url}&client=requests")
print("PY=%d" % r.status_code)
print("PYBODY=" + json.dumps(r.json()))'
"#
    );
    let out = rig.sandboxed(profile, &script).await;
    assert!(out.success(), "{out}");
    assert_eq!(line_value(&out, "CODE"), "200", "{out}");
    assert_eq!(line_value(&out, "PY"), "200", "{out}");
    let body: Value = serde_json::from_str(line_value(&out, "PYBODY")).unwrap();
    assert_eq!(body["query"], "from=sandbox&client=requests");
    assert!(
        body["headers"].get("proxy-authorization").is_none(),
        "{body}"
    );
    assert_eq!(rig.upstream.count("/echo"), 2);
    let said = said(&out);
    assert_eq!(said.report["exit"], 0);
    assert_eq!(said.report["profile"], profile);
}

/// Every way out but the proxy, tried from inside; each prints `NAME=` and what happened.
const ESCAPES: &str = r#"
import socket, sys
up, ctrl, udp_port, dns_port, abstract, resolver = sys.argv[1:7]
def tcp(name, family, addr):
    try:
        s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(3); s.connect(addr)
        print(name + "=connected")
    except OSError as e:
        print(name + "=refused " + type(e).__name__)
tcp("TCP4", socket.AF_INET, ("127.0.0.1", int(up)))
tcp("TCP6", socket.AF_INET6, ("::1", int(up)))
tcp("CONTROL", socket.AF_INET, ("127.0.0.1", int(ctrl)))
tcp("DNSTCP", socket.AF_INET, ("127.0.0.1", int(dns_port)))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"from-the-sandbox", ("127.0.0.1", int(udp_port)))
# A DNS query for api.example.test, to a resolver on the host's loopback.
query = bytes.fromhex("abcd01000001000000000000") + b"\x03api\x07example\x04test\x00\x00\x01\x00\x01"
d = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); d.settimeout(2)
d.sendto(query, ("127.0.0.1", int(dns_port)))
try:
    d.recvfrom(512); print("DNS=answered")
except OSError as e:
    print("DNS=unanswered " + type(e).__name__)
# connect() on a UDP socket sends nothing: it only asks for a route.
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    r.connect((resolver, 53)); print("ROUTE=" + resolver)
except OSError as e:
    print("ROUTE=none " + type(e).__name__)
a = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    a.connect("\0" + abstract); print("ABSTRACT=connected")
except OSError as e:
    print("ABSTRACT=refused " + type(e).__name__)
ifaces = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
print("IFACES=" + ",".join(ifaces))
print("ROUTES=%d" % (len(open("/proc/net/route").read().splitlines()) - 1))
"#;

/// A UDP and a TCP listener on the same loopback port, as a resolver has. The
/// kernel picks the UDP port; its TCP twin may be taken by a parallel test, so
/// another port is drawn until both are free.
fn udp_and_tcp_on_one_port() -> (UdpSocket, TcpListener) {
    for _ in 0..64 {
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if let Ok(tcp) = TcpListener::bind(("127.0.0.1", port)) {
            return (udp, tcp);
        }
    }
    panic!("no loopback port was free for both UDP and TCP in 64 draws");
}

pub(crate) async fn nothing_but_the_proxy(profile: &str) {
    let rig = Rig::start(None, "").await;
    std::fs::write(rig.work.path().join("escapes.py"), ESCAPES).unwrap();
    // Host listeners a command outside a sandbox would reach at once.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (dns, dns_tcp) = udp_and_tcp_on_one_port();
    let dns_port = dns.local_addr().unwrap().port();
    dns_tcp.set_nonblocking(true).unwrap();
    let name = format!("ostiary-sandbox-test-{}", std::process::id());
    let abstract_addr = {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap()
    };
    let abstract_listener = std::os::unix::net::UnixListener::bind_addr(&abstract_addr).unwrap();
    abstract_listener.set_nonblocking(true).unwrap();
    let resolver = std::fs::read_to_string("/etc/resolv.conf")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("nameserver ").map(|a| a.trim().to_owned()))
        .filter(|a| a.parse::<std::net::Ipv4Addr>().is_ok())
        .unwrap_or_else(|| "192.0.2.53".to_owned());
    let (up, ctrl, udp_port) = (
        rig.upstream.port().to_string(),
        rig.server.control_addr.port().to_string(),
        udp.local_addr().unwrap().port().to_string(),
    );
    let script = format!(
        "{PYTHON} escapes.py {up} {ctrl} {udp_port} {dns_port} {name} {resolver}
curl -q -sS --noproxy '*' --max-time 5 -k 'https://127.0.0.1:{up}/echo'; echo \"CURL=$?\"
curl -q -sS --noproxy '*' --max-time 5 -k --resolve 'api.example.test:{up}:127.0.0.1' 'https://api.example.test:{up}/echo'; echo \"CURLRESOLVE=$?\""
    );
    let out = rig.sandboxed(profile, &script).await;
    assert!(out.success(), "{out}");
    for probe in ["TCP4", "TCP6", "CONTROL", "DNSTCP", "ABSTRACT"] {
        assert!(
            line_value(&out, probe).starts_with("refused"),
            "{probe}:\n{out}"
        );
    }
    assert!(line_value(&out, "DNS").starts_with("unanswered"), "{out}");
    assert!(line_value(&out, "ROUTE").starts_with("none"), "{out}");
    assert_eq!(line_value(&out, "IFACES"), "lo", "{out}");
    assert_eq!(line_value(&out, "ROUTES"), "0", "{out}");
    for probe in ["CURL", "CURLRESOLVE"] {
        assert_ne!(line_value(&out, probe), "0", "{probe}:\n{out}");
    }
    // Nothing arrived on the host: not a connection to the upstream, not a datagram (the
    // first one each socket receives now is the test's own), not a DNS query over TCP, not
    // a connection to the abstract socket.
    assert_eq!(rig.upstream.connections(), 0);
    for socket in [&udp, &dns] {
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender
            .send_to(b"sentinel", socket.local_addr().unwrap())
            .unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, _) = socket.recv_from(&mut buf).unwrap();
        assert_eq!(
            &buf[..n],
            b"sentinel",
            "a datagram from the sandbox arrived first"
        );
    }
    assert_eq!(
        dns_tcp.accept().map(|_| ()).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
    assert_eq!(
        abstract_listener.accept().map(|_| ()).unwrap_err().kind(),
        ErrorKind::WouldBlock
    );
}

/// The operator's secrets as a hostile command would look for them: in its environment and
/// its processes', in the state directory, in the file backend's secrets, anywhere in the
/// view, in the working-directory copy, and on a descriptor left open.
pub(crate) async fn secrets_out_of_sight(profile: &str) {
    let vault = tempfile::tempdir().unwrap();
    let secrets = vault.path().join("secrets.toml");
    std::fs::write(&secrets, "demo = \"canary-file-secret\"\n").unwrap();
    // Readable by anyone: what keeps the command from them is the view, not the modes.
    open_to_all(vault.path(), &secrets);
    let extra = format!(
        r#"
[broker]
backend = "file"
file = "{secrets}"

[approvals]
slack_webhook_env = "TEAM_SLACK_HOOK"

[sandbox]
env = ["PATH", "LANG", "TEAM_SLACK_HOOK", "ALLOWED_PLAIN"]
"#,
        secrets = secrets.display()
    );
    let rig = Rig::start(None, &extra).await;
    let server_dir = rig.server.dir.path().to_owned();
    open_to_all(&server_dir, &rig.server.config);
    // The view shows the proxy's directory and the secrets' (read-only): what is secret in
    // them must still not be seen.
    rig.append_config(&format!(
        "[sandbox.profiles.{profile}]\nread_only = [{SYSTEM}, \"{}\", \"{}\"]",
        server_dir.display(),
        vault.path().display()
    ));
    let admin = rig.admin_token();
    let env = [
        ("OSTIARY_ADMIN_TOKEN", admin.as_str()),
        ("VAULT_TOKEN", "canary-vault-token"),
        ("BAO_TOKEN", "canary-bao-token"),
        ("TEAM_SLACK_HOOK", "https://hooks.example/canary-slack"),
        ("NOT_ALLOWED", "canary-not-allowed"),
        ("ALLOWED_PLAIN", "plain-and-allowed"),
    ];
    not_in_the_view(&rig, profile, &secrets, vault.path(), &env).await;
    not_in_the_copy(&rig, profile, &env).await;
    not_on_a_descriptor(&rig, profile, &secrets).await;
}

/// The view shows the proxy's directory and the secrets' directory: the state directory,
/// the admin token, the keys and the secrets file are still not seen, nor the secret
/// variables, in the environment or any process's.
async fn not_in_the_view(
    rig: &Rig,
    profile: &str,
    secrets: &Path,
    vault: &Path,
    env: &[(&str, &str)],
) {
    let server_dir = rig.server.dir.path();
    let state = &rig.server.state;
    let admin = rig.admin_token();
    let script = format!(
        r#"env
cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n'
{PYTHON} -c 'import os, sys
try:
    print("LSSTATE=" + ",".join(os.listdir(sys.argv[1])))
except OSError as e:
    print("LSSTATE=refused " + type(e).__name__)' '{state}'
{PYTHON} -c 'import os, sys; print("STATEMODE=%o" % (os.stat(sys.argv[1]).st_mode & 0o7777))' '{state}'
cat '{state}/admin.token' 2>&1; echo "CATTOKEN=$?"
cat '{state}/ca.key.pem' '{state}/session-signing.key.pem' '{state}/ostiary.db' 2>&1
echo "SECRETS=$(cat '{secrets}' 2>&1 | wc -c)"
echo "CONFIG=$(grep -c '^\[listen\]' '{server}/ostiary.toml')"
find /tmp /home /run '{server}' '{vault}' -type f -size -1M -exec cat {{}} + 2>/dev/null
find / \( -path /proc -o -path /usr -o -path /opt \) -prune -o -name admin.token -print 2>/dev/null
echo done"#,
        state = state.display(),
        secrets = secrets.display(),
        server = server_dir.display(),
        vault = vault.display(),
    );
    // (The search for an admin token skips the big system trees, which hold no test's
    // state: under gVisor's ptrace platform walking them takes most of a minute.)
    let out = rig.sandboxed_with(profile, &script, env).await;
    assert!(out.success(), "{out}");
    assert!(out.stdout.ends_with("done\n"), "{out}");
    for canary in [
        "canary",
        admin.as_str(),
        "BEGIN PRIVATE KEY",
        "SQLite format",
    ] {
        assert!(
            !out.stdout.contains(canary),
            "{canary:?} is visible inside:\n{out}"
        );
    }
    assert!(
        out.stdout.contains("ALLOWED_PLAIN=plain-and-allowed"),
        "{out}"
    );
    assert!(!out.stdout.contains("OSTIARY_"), "{out}");
    assert!(line_value(&out, "LSSTATE").starts_with("refused"), "{out}");
    // Not the host's `0700` directory: the empty, unreadable one over it.
    assert_eq!(line_value(&out, "STATEMODE"), "0", "{out}");
    assert_ne!(line_value(&out, "CATTOKEN"), "0", "{out}");
    assert_eq!(line_value(&out, "SECRETS"), "0", "{out}");
    // The rest of the proxy's directory is in view, so the refusals above are the hiding.
    assert_eq!(line_value(&out, "CONFIG"), "1", "{out}");
}

/// Run from the proxy's directory: the working-directory copy has the config and the
/// policies but not the state directory.
async fn not_in_the_copy(rig: &Rig, profile: &str, env: &[(&str, &str)]) {
    let (server_dir, admin) = (rig.server.dir.path(), rig.admin_token());
    let script = "find . -maxdepth 1; cat state/admin.token 2>&1; echo \"CAT=$?\"; echo \"POLICY=$(cd policies && echo *)\"; find . -type f -exec cat {} +; echo done";
    let out = rig
        .run_from(
            server_dir,
            &[
                "-v",
                &format!("--sandbox={profile}"),
                "--agent",
                "demo",
                "--",
                "sh",
                "-c",
                script,
            ],
            env,
        )
        .await;
    assert!(out.success(), "{out}");
    assert!(!out.stdout.contains(&admin), "{out}");
    assert!(!out.stdout.lines().any(|l| l == "./state"), "{out}");
    assert!(out.stdout.lines().any(|l| l == "./ostiary.toml"), "{out}");
    assert_ne!(line_value(&out, "CAT"), "0", "{out}");
    assert_eq!(line_value(&out, "POLICY"), "test.cedar", "{out}");
}

/// A descriptor the operator's shell left open on `ostiary run` goes no further.
async fn not_on_a_descriptor(rig: &Rig, profile: &str, secrets: &Path) {
    let profile_flag = format!("--sandbox={profile}");
    let out = rig
        .run_with_fd7(
            secrets,
            &[&profile_flag, "--agent", "demo", "--", "sh", "-c", &format!("cat <&7; cat /proc/self/fd/7; {PYTHON} -c 'import os; print(\" \".join(sorted(os.listdir(\"/proc/self/fd\"), key=int)))'")],
        )
        .await;
    assert!(out.success(), "{out}");
    assert!(!out.stdout.contains("canary"), "{out}");
    assert_eq!(
        out.stdout.trim(),
        "0 1 2 3",
        "only stdio (and listdir's own) are open:\n{out}"
    );
}

pub(crate) async fn writes_do_not_persist(profile: &str) {
    let rig = Rig::start(None, "").await;
    let shared = tempfile::tempdir().unwrap();
    std::fs::write(shared.path().join("notes.txt"), "original\n").unwrap();
    rig.append_config(&format!(
        "[sandbox.profiles.{profile}]\nread_only = [{SYSTEM}, \"{}\"]",
        shared.path().display()
    ));
    let shared_dir = shared.path().display().to_string();
    let script = format!(
        r#"echo x > /usr/ostiary-probe; echo "USR=$?"
echo x > /etc/ostiary-probe; echo "ETC=$?"
echo changed > '{shared_dir}/notes.txt'; echo "SHARED=$?"
rm -f '{shared_dir}/notes.txt'; echo "SHAREDRM=$?"
echo "DATA=$(cat data.txt)"
echo changed > data.txt && echo new > new.txt && mkdir made && echo "WORKDIR=$?"
echo "DATA2=$(cat data.txt)"
echo x > "$HOME/home.txt" && echo x > /tmp/tmp.txt && echo "PRIVATE=$?"
echo "HOMEFILE=$(cat "$HOME/home.txt")"
ln -s /etc/passwd link-out; echo "LINK=$?"
"#
    );
    let out = rig.sandboxed(profile, &script).await;
    assert!(out.success(), "{out}");
    for probe in ["USR", "ETC", "SHARED", "SHAREDRM"] {
        assert_ne!(line_value(&out, probe), "0", "{probe} was writable:\n{out}");
    }
    assert_eq!(
        line_value(&out, "DATA"),
        "host data",
        "the copy of the working directory"
    );
    for probe in ["WORKDIR", "PRIVATE", "LINK"] {
        assert_eq!(line_value(&out, probe), "0", "{probe}:\n{out}");
    }
    assert_eq!(line_value(&out, "DATA2"), "changed");
    // None of it reached the host.
    let work = rig.work.path();
    assert_eq!(
        std::fs::read_to_string(work.join("data.txt")).unwrap(),
        "host data\n"
    );
    for gone in ["new.txt", "made", "link-out"] {
        assert!(!work.join(gone).exists(), "{gone} appeared on the host");
    }
    assert!(!std::path::Path::new("/usr/ostiary-probe").exists());
    assert!(!std::path::Path::new("/etc/ostiary-probe").exists());
    assert_eq!(
        std::fs::read_to_string(shared.path().join("notes.txt")).unwrap(),
        "original\n"
    );
    // The run's staging directory on the host is gone too.
    assert!(!said(&out).staging.exists());
}

/// Calls an agent never needs, each tried and reported as `NAME=errno` (0: it worked).
#[cfg(target_arch = "x86_64")]
const SYSCALLS: &str = r#"
import ctypes, errno, os, socket, time
libc = ctypes.CDLL(None, use_errno=True)
# Who the command is: its own uid, no capabilities, no way to gain privileges, filtered.
print("UID=%d" % os.getuid())
print("NNP=%d" % libc.prctl(39, 0, 0, 0, 0))
print("SECCOMP_MODE=%d" % libc.prctl(21, 0, 0, 0, 0))
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith(("CapEff", "CapPrm"))]
print("CAPS=" + ",".join(caps))
def call(name, *args):
    r = libc.syscall(*args)
    e = ctypes.get_errno() if r == -1 else 0
    if r == 0 and name.startswith("CLONE"):
        os._exit(0)
    print("%s=%s" % (name, errno.errorcode.get(e, e) if e else "0"))
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x20000, 0x40000000, 17
call("UNSHARE_USER", 272, CLONE_NEWUSER)
call("UNSHARE_NET", 272, CLONE_NEWNET)
call("CLONE_NEWUSER", 56, CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0)
call("CLONE_NEWNS", 56, CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0)
call("CLONE3", 435, 0, 0)
call("MOUNT", 165, b"none", b"/tmp", b"tmpfs", 0, 0)
call("UMOUNT", 166, b"/tmp", 0)
call("PIVOT_ROOT", 155, b"/tmp", b"/tmp")
call("FSOPEN", 430, b"tmpfs", 0)
call("KEYCTL", 250, 0, -3, 1)
call("ADD_KEY", 248, b"user", b"k", b"v", 1, -3)
call("BPF", 321, 0, 0, 0)
call("PERF", 298, 0, 0, -1, -1, 0)
call("USERFAULTFD", 323, 0)
call("IO_URING", 425, 8, 0)
call("SETNS", 308, 0, 0)
call("INIT_MODULE", 175, 0, 0, b"")
call("KEXEC", 246, 0, 0, 0, 0)
call("SYSLOG", 103, 3, 0, 0)
call("TIOCSTI", 16, 0, 0x5412, b"x")
child = os.fork()
if child == 0:
    time.sleep(30); os._exit(0)
call("PTRACE_ATTACH", 101, 16, child, 0, 0)
call("PTRACE_INIT", 101, 16, 1, 0, 0)
call("VM_READV", 310, child, 0, 1, 0, 1, 0)
os.kill(child, 9)
for name, args in [("RAW4", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                   ("RAW4_NONBLOCK", (socket.AF_INET, socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC, 255)),
                   ("RAW6", (socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)),
                   ("PACKET", (socket.AF_PACKET, socket.SOCK_RAW, 0)),
                   ("PACKET_DGRAM", (socket.AF_PACKET, socket.SOCK_DGRAM, 0)),
                   ("NETLINK_UEVENT", (socket.AF_NETLINK, socket.SOCK_RAW, 15)),
                   ("NETLINK_AUDIT", (socket.AF_NETLINK, socket.SOCK_RAW, 9)),
                   ("NETLINK_DIAG", (socket.AF_NETLINK, socket.SOCK_DGRAM, 4)),
                   ("NETLINK_ROUTE", (socket.AF_NETLINK, socket.SOCK_RAW, 0)),
                   ("TCP", (socket.AF_INET, socket.SOCK_STREAM, 0)),
                   ("UDP6", (socket.AF_INET6, socket.SOCK_DGRAM, 0)),
                   ("UNIX", (socket.AF_UNIX, socket.SOCK_STREAM, 0))]:
    try:
        socket.socket(*args).close(); print(name + "=0")
    except OSError as e:
        print("%s=%s" % (name, errno.errorcode.get(e.errno, e.errno)))
# What programs do all the time still works: threads, fork, pipes.
import threading
t = threading.Thread(target=lambda: None); t.start(); t.join()
r, w = os.pipe(); pid = os.fork()
if pid == 0:
    os.write(w, b"ok"); os._exit(0)
os.waitpid(pid, 0); print("FORK=" + os.read(r, 2).decode())
"#;

#[cfg(target_arch = "x86_64")]
pub(crate) async fn seccomp_refuses(profile: &str) {
    let rig = Rig::start(None, "").await;
    std::fs::write(rig.work.path().join("syscalls.py"), SYSCALLS).unwrap();
    let script = format!(
        "{PYTHON} syscalls.py
unshare -U true 2>/dev/null; echo \"UNSHARE_U=$?\"
unshare -r -n true 2>/dev/null; echo \"UNSHARE_RN=$?\"
mount -t tmpfs none /tmp 2>/dev/null; echo \"MOUNT_CMD=$?\""
    );
    let out = rig.sandboxed(profile, &script).await;
    assert!(out.success(), "{out}");
    let uid: u32 = line_value(&out, "UID").parse().unwrap();
    assert_eq!(uid, said(&out).uid, "{out}");
    if own_uid() == 0 {
        assert_ne!(
            uid, 0,
            "a root run gives the command a uid of its own:\n{out}"
        );
    }
    assert_eq!(line_value(&out, "NNP"), "1", "no_new_privs:\n{out}");
    assert_eq!(
        line_value(&out, "SECCOMP_MODE"),
        "2",
        "a seccomp filter:\n{out}"
    );
    assert_eq!(
        line_value(&out, "CAPS"),
        "0000000000000000,0000000000000000",
        "{out}"
    );
    for name in [
        "UNSHARE_USER",
        "UNSHARE_NET",
        "CLONE_NEWUSER",
        "CLONE_NEWNS",
        "MOUNT",
        "UMOUNT",
        "PIVOT_ROOT",
        "FSOPEN",
        "KEYCTL",
        "ADD_KEY",
        "BPF",
        "PERF",
        "USERFAULTFD",
        "IO_URING",
        "SETNS",
        "INIT_MODULE",
        "KEXEC",
        "SYSLOG",
        "TIOCSTI",
        "PTRACE_ATTACH",
        "PTRACE_INIT",
        "VM_READV",
        "RAW4",
        "RAW4_NONBLOCK",
        "RAW6",
        "PACKET",
        "PACKET_DGRAM",
        "NETLINK_UEVENT",
        "NETLINK_AUDIT",
        "NETLINK_DIAG",
    ] {
        assert_eq!(line_value(&out, name), "EPERM", "{name}:\n{out}");
    }
    // clone3 is answered "not implemented", so C libraries fall back to clone.
    assert_eq!(line_value(&out, "CLONE3"), "ENOSYS", "{out}");
    for name in ["NETLINK_ROUTE", "TCP", "UDP6", "UNIX"] {
        assert_eq!(
            line_value(&out, name),
            "0",
            "{name} must still work:\n{out}"
        );
    }
    assert_eq!(line_value(&out, "FORK"), "ok", "{out}");
    for name in ["UNSHARE_U", "UNSHARE_RN", "MOUNT_CMD"] {
        assert_ne!(line_value(&out, name), "0", "{name}:\n{out}");
    }
}
