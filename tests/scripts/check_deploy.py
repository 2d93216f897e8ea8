"""Checks the example deployment files in deploy/ and extracts what the Rust side parses.

docs/deploy.md promises properties of these files (three replicas, probes, a drain that fits
the grace period, a restricted security context, references that resolve, a hardened unit);
this script is what holds them to it. tests/tests/deploy.rs runs it, then parses the config
and the policies it extracts with Ostiary's own code.

usage: check_deploy.py [--k8s-dir DIR] [--systemd-dir DIR] [--kube-version X.Y] OUT_DIR

  (a) every manifest validates, offline and strict (unknown fields refused), against the
      Kubernetes schemas of --kube-version (default 1.30) shipped by kubernetes-validate;
  (b) the properties docs/deploy.md states hold, across files;
  (c) OUT_DIR receives ostiary.toml (from the ostiary-config ConfigMap), policies/ (the
      ostiary-policies ConfigMap, laid out as the kubelet does: files are symlinks into a
      `..data` directory) and deployment.json (the mounts, ports and key files, for the
      cross-checks the Rust side makes);
  (d) the systemd unit is checked by `systemd-analyze verify` (and `security --offline`)
      when systemd-analyze is installed, and always by parsing it.

Exits 0 printing one `ok:` line per file, or 1 after naming every failure on stderr
(`FAIL <file>: <what>`); a missing package is a failure too, never a skip.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import yaml
    import kubernetes_validate
    from kubernetes_validate import utils as kv_utils
except ImportError as e:  # a broken test machine, not a pass
    sys.exit(
        f"check_deploy.py: cannot import {e.name} ({e}); scripts/test.sh --setup-only "
        "installs kubernetes-validate and PyYAML into the venv"
    )
try:
    import tomllib
except ImportError:
    sys.exit("check_deploy.py: needs Python 3.11 or later (tomllib)")

ROOT = Path(__file__).resolve().parents[2]

NAMESPACE = "ostiary"
REPLICAS = 3
PROXY_PORT = 8080
CONTROL_PORT = 8081
# Requests in flight get this long after SIGTERM (docs/configuration.md, docs/deploy.md).
DRAIN_BOUND_S = 30
CONFIG_PATH = "/etc/ostiary/ostiary.toml"
EXEC_ARGS = ["/usr/local/bin/ostiary", "--config", CONFIG_PATH, "serve"]
# What `ostiary state init --dir keys/` writes and `state.keys_dir` must hold.
KEY_FILES = [
    "ca.pem",
    "ca.key.pem",
    "session-signing.key.pem",
    "session-signing.pub.pem",
    "audit.key",
    "approvals.key",
    "audit-signing.key.pem",
    "audit-signing.pub.pem",
]
# Secrets the manifests use but leave to a documented command (docs/deploy.md): their keys.
EXTERNAL_SECRETS = {"ostiary-keys": KEY_FILES}
SECRET_ENV = [
    "OSTIARY_ADMIN_TOKEN",
    "OSTIARY_VAULT_SECRET_ID",
    "OSTIARY_STATE_STORE",
    "OSTIARY_STATE_REDIS",
]
MIN_ADMIN_TOKEN_LEN = 32


class Checker:
    def __init__(self):
        self.failures = []

    def fail(self, where, message):
        self.failures.append(f"FAIL {where}: {message}")

    def expect(self, condition, where, message):
        if not condition:
            self.fail(where, message)
        return bool(condition)


# ---------------------------------------------------------------- Kubernetes


def load_manifests(k8s_dir, c):
    """Every document of every *.yaml / *.yml file, as (file name, document)."""
    files = sorted(p for p in Path(k8s_dir).iterdir() if p.suffix in (".yaml", ".yml"))
    if not files:
        c.fail(str(k8s_dir), "no *.yaml manifests")
    docs = []
    for path in files:
        try:
            loaded = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as e:
            c.fail(path.name, f"not YAML: {e}")
            continue
        if not loaded:
            c.fail(path.name, "no document")
        for doc in loaded:
            docs.append((path.name, doc))
    return docs


def validate_schemas(docs, version, c):
    for name, doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            c.fail(name, "a document without apiVersion and kind")
            continue
        what = f"{name} {doc['kind']}/{doc.get('metadata', {}).get('name', '?')}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "(top level)"
            c.fail(what, f"not valid for Kubernetes {version} (strict): {path}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError as e:
            c.fail(what, f"no schema (a typo in apiVersion/kind?): {e.message}")
        except kv_utils.VersionNotSupportedError:
            c.fail(what, f"kubernetes-validate has no schemas for Kubernetes {version}")


def index(docs, c):
    by_kind = {}
    for name, doc in docs:
        if not isinstance(doc, dict):
            continue
        kind = doc.get("kind")
        meta = doc.get("metadata") or {}
        res_name = meta.get("name")
        if kind != "Namespace" and meta.get("namespace") != NAMESPACE:
            c.fail(f"{name} {kind}/{res_name}", f"metadata.namespace is not {NAMESPACE!r}")
        key = (kind, res_name)
        if key in by_kind:
            c.fail(name, f"{kind}/{res_name} is defined twice")
        by_kind[key] = (name, doc)
    return by_kind


def need(by_kind, kind, name, c):
    found = by_kind.get((kind, name))
    if found is None:
        c.fail("deploy/k8s", f"no {kind} named {name!r}")
        return None, {}
    return found


def selects(selector_labels, pod_labels):
    """A matchLabels selector that is non-empty and satisfied by the pod's labels."""
    return bool(selector_labels) and all(pod_labels.get(k) == v for k, v in selector_labels.items())


def port_number(port, ports_by_name):
    """A probe's or Service's port: a number, or the name of a container port."""
    if isinstance(port, int):
        return port
    return ports_by_name.get(port)


def check_deployment(by_kind, c):
    where, dep = need(by_kind, "Deployment", "ostiary", c)
    facts = {}
    if dep is None:
        return facts, {}
    where = f"{where} Deployment/ostiary"
    spec = dep.get("spec") or {}
    c.expect(
        spec.get("replicas") == REPLICAS,
        where,
        f"spec.replicas is {spec.get('replicas')!r}, not {REPLICAS}",
    )
    template = spec.get("template") or {}
    pod_labels = (template.get("metadata") or {}).get("labels") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    c.expect(
        selects(selector, pod_labels),
        where,
        f"spec.selector {selector} does not match the pod labels {pod_labels}",
    )
    pod = template.get("spec") or {}

    containers = pod.get("containers") or []
    if not c.expect(
        len(containers) == 1,
        where,
        f"{len(containers)} containers, expected the one ostiary container",
    ):
        return facts, pod_labels
    ctr = containers[0]
    cwhere = f"{where} container {ctr.get('name')!r}"
    argv = (ctr.get("command") or []) + (ctr.get("args") or [])
    c.expect(argv == EXEC_ARGS, cwhere, f"command+args are {argv}, expected {EXEC_ARGS}")

    ports = {p.get("name"): p.get("containerPort") for p in ctr.get("ports") or []}
    c.expect(
        ports.get("proxy") == PROXY_PORT,
        cwhere,
        f"container port 'proxy' is {ports.get('proxy')!r}, not {PROXY_PORT}",
    )
    c.expect(
        ports.get("control") == CONTROL_PORT,
        cwhere,
        f"container port 'control' is {ports.get('control')!r}, not {CONTROL_PORT}",
    )
    facts["ports"] = ports

    for probe_name, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        probe = ctr.get(probe_name)
        if not c.expect(isinstance(probe, dict), cwhere, f"no {probe_name}"):
            continue
        http = probe.get("httpGet")
        if not c.expect(isinstance(http, dict), cwhere, f"{probe_name} is not an httpGet probe"):
            continue
        c.expect(
            http.get("path") == path,
            cwhere,
            f"{probe_name} path is {http.get('path')!r}, not {path!r}",
        )
        got = port_number(http.get("port"), ports)
        c.expect(
            got == CONTROL_PORT,
            cwhere,
            f"{probe_name} port {http.get('port')!r} is {got!r}, not the control port {CONTROL_PORT}",
        )
        c.expect(http.get("scheme", "HTTP") == "HTTP", cwhere, f"{probe_name} scheme is not HTTP")

    # The grace period covers the preStop wait and then the drain bound.
    grace = pod.get("terminationGracePeriodSeconds")
    pre_stop = (ctr.get("lifecycle") or {}).get("preStop") or {}
    pre_stop_s = (pre_stop.get("sleep") or {}).get("seconds", 0)
    c.expect(
        not (set(pre_stop) - {"sleep"}),
        cwhere,
        f"preStop uses {sorted(set(pre_stop) - {'sleep'})}: the image has no shell; use the sleep action",
    )
    if c.expect(isinstance(grace, int), where, "no terminationGracePeriodSeconds"):
        c.expect(
            grace > DRAIN_BOUND_S,
            where,
            f"terminationGracePeriodSeconds {grace} is not longer than the drain bound ({DRAIN_BOUND_S} s)",
        )
        c.expect(
            grace > DRAIN_BOUND_S + pre_stop_s,
            where,
            f"terminationGracePeriodSeconds {grace} does not cover preStop ({pre_stop_s} s) + the drain bound ({DRAIN_BOUND_S} s)",
        )

    # Security context: the container's settings, or the pod's where Kubernetes inherits them.
    psc = pod.get("securityContext") or {}
    csc = ctr.get("securityContext") or {}
    run_as_non_root = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
    c.expect(run_as_non_root is True, cwhere, "runAsNonRoot is not true")
    run_as_user = csc.get("runAsUser", psc.get("runAsUser"))
    c.expect(
        isinstance(run_as_user, int) and run_as_user > 0,
        cwhere,
        f"runAsUser is {run_as_user!r}: a non-zero uid is needed for runAsNonRoot with any image",
    )
    c.expect(
        csc.get("readOnlyRootFilesystem") is True, cwhere, "readOnlyRootFilesystem is not true"
    )
    c.expect(
        csc.get("allowPrivilegeEscalation") is False,
        cwhere,
        "allowPrivilegeEscalation is not false",
    )
    c.expect(csc.get("privileged") in (None, False), cwhere, "privileged")
    caps = csc.get("capabilities") or {}
    c.expect("ALL" in (caps.get("drop") or []), cwhere, "capabilities.drop does not contain ALL")
    c.expect(not caps.get("add"), cwhere, f"capabilities.add is {caps.get('add')}")
    seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
    c.expect(seccomp in ("RuntimeDefault", "Localhost"), cwhere, f"seccompProfile is {seccomp!r}")

    res = ctr.get("resources") or {}
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            c.expect(r in (res.get(kind) or {}), cwhere, f"no resources.{kind}.{r}")

    # Replicas spread over nodes: anti-affinity selecting the pods themselves.
    anti = (pod.get("affinity") or {}).get("podAntiAffinity") or {}
    terms = [
        t.get("podAffinityTerm") or {}
        for t in anti.get("preferredDuringSchedulingIgnoredDuringExecution") or []
    ]
    terms += anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []
    c.expect(
        any(
            selects((t.get("labelSelector") or {}).get("matchLabels") or {}, pod_labels)
            and t.get("topologyKey")
            for t in terms
        ),
        where,
        "no podAntiAffinity term selecting the ostiary pods",
    )

    facts["env"] = check_env(by_kind, ctr, cwhere, c)
    facts.update(check_volumes(by_kind, pod, ctr, cwhere, c))
    facts["termination_grace_s"] = grace
    facts["pre_stop_s"] = pre_stop_s
    return facts, pod_labels


def secret_keys(by_kind, name):
    if name in EXTERNAL_SECRETS:
        return set(EXTERNAL_SECRETS[name])
    found = by_kind.get(("Secret", name))
    if found is None:
        return None
    doc = found[1]
    return set(doc.get("data") or {}) | set(doc.get("stringData") or {})


def configmap_keys(by_kind, name):
    found = by_kind.get(("ConfigMap", name))
    if found is None:
        return None
    doc = found[1]
    return set(doc.get("data") or {}) | set(doc.get("binaryData") or {})


def check_env(by_kind, ctr, where, c):
    """Every reference resolves to a key of a Secret or ConfigMap the files define."""
    env = {}
    for var in ctr.get("env") or []:
        name = var.get("name")
        ref = var.get("valueFrom") or {}
        for kind, lookup in (("secretKeyRef", secret_keys), ("configMapKeyRef", configmap_keys)):
            if kind in ref:
                target, key = ref[kind].get("name"), ref[kind].get("key")
                keys = lookup(by_kind, target)
                if c.expect(
                    keys is not None,
                    where,
                    f"env {name}: {kind} names {target!r}, which no file defines",
                ):
                    c.expect(
                        key in keys,
                        where,
                        f"env {name}: {target!r} has no key {key!r} (it has {sorted(keys)})",
                    )
                env[name] = {"from": kind, "name": target, "key": key}
        if "value" in var:
            env[name] = {"value": var["value"]}
    for source in ctr.get("envFrom") or []:
        for kind, lookup in (("secretRef", secret_keys), ("configMapRef", configmap_keys)):
            if kind in source:
                target = source[kind].get("name")
                keys = lookup(by_kind, target)
                if c.expect(
                    keys is not None,
                    where,
                    f"envFrom {kind} names {target!r}, which no file defines",
                ):
                    for key in keys:
                        env.setdefault(key, {"from": kind, "name": target, "key": key})
    for name in SECRET_ENV:
        got = env.get(name) or {}
        c.expect(
            got.get("name") == "ostiary-secrets" and got.get("key") == name,
            where,
            f"env {name} does not come from Secret ostiary-secrets key {name} (got {got or 'nothing'})",
        )
    return env


def check_volumes(by_kind, pod, ctr, where, c):
    volumes = {v.get("name"): v for v in pod.get("volumes") or []}
    mounts = ctr.get("volumeMounts") or []
    mounted = set()
    out = {"mounts": {}, "empty_dirs": [], "key_files": []}
    for m in mounts:
        vname, path = m.get("name"), m.get("mountPath")
        vol = volumes.get(vname)
        if not c.expect(
            vol is not None,
            where,
            f"volumeMount {path} names volume {vname!r}, which the pod does not define",
        ):
            continue
        mounted.add(vname)
        entry = {"volume": vname, "read_only": bool(m.get("readOnly"))}
        if "subPath" in m:
            entry["sub_path"] = m["subPath"]
        if "configMap" in vol:
            cm = vol["configMap"].get("name")
            keys = configmap_keys(by_kind, cm)
            entry["configmap"] = cm
            if c.expect(
                keys is not None,
                where,
                f"volume {vname!r} uses ConfigMap {cm!r}, which no file defines",
            ):
                for item in vol["configMap"].get("items") or []:
                    c.expect(
                        item.get("key") in keys,
                        where,
                        f"volume {vname!r}: ConfigMap {cm!r} has no key {item.get('key')!r}",
                    )
                if "sub_path" in entry:
                    c.expect(
                        entry["sub_path"] in keys,
                        where,
                        f"mount {path}: ConfigMap {cm!r} has no key {entry['sub_path']!r}",
                    )
            c.expect(entry["read_only"], where, f"mount {path} (ConfigMap {cm}) is not readOnly")
        elif "secret" in vol:
            sname = vol["secret"].get("secretName")
            keys = secret_keys(by_kind, sname)
            entry["secret"] = sname
            items = vol["secret"].get("items") or []
            if c.expect(
                keys is not None,
                where,
                f"volume {vname!r} uses Secret {sname!r}, which neither the files nor EXTERNAL_SECRETS define",
            ):
                for item in items:
                    c.expect(
                        item.get("key") in keys,
                        where,
                        f"volume {vname!r}: Secret {sname!r} has no key {item.get('key')!r}",
                    )
            c.expect(entry["read_only"], where, f"mount {path} (Secret {sname}) is not readOnly")
            if sname == "ostiary-keys":
                got = sorted(item.get("path") for item in items)
                c.expect(
                    got == sorted(KEY_FILES),
                    where,
                    f"volume {vname!r} mounts {got}, expected exactly the key files {sorted(KEY_FILES)}",
                )
                c.expect(
                    all(i.get("key") == i.get("path") for i in items),
                    where,
                    f"volume {vname!r}: an item's path differs from its key",
                )
                mode = vol["secret"].get("defaultMode")
                c.expect(
                    mode is not None and mode & 0o007 == 0,
                    where,
                    f"volume {vname!r}: defaultMode {mode!r} lets other users read the keys (0440 or 0400, in octal)",
                )
                out["key_files"] = got
        elif "emptyDir" in vol:
            out["empty_dirs"].append(path)
        else:
            c.fail(where, f"volume {vname!r} is of a kind this check does not know: {sorted(vol)}")
        out["mounts"][path] = entry
    for vname in set(volumes) - mounted:
        c.fail(where, f"volume {vname!r} is never mounted")
    return out


def check_services(by_kind, pod_labels, ports, c):
    for name, port, want_type in (
        ("ostiary-proxy", PROXY_PORT, None),
        ("ostiary-control", CONTROL_PORT, "ClusterIP"),
    ):
        where, svc = need(by_kind, "Service", name, c)
        if svc is None:
            continue
        where = f"{where} Service/{name}"
        spec = svc.get("spec") or {}
        c.expect(
            selects(spec.get("selector") or {}, pod_labels),
            where,
            f"selector {spec.get('selector')} does not match the pod labels {pod_labels}",
        )
        if want_type:
            c.expect(
                spec.get("type", "ClusterIP") == want_type,
                where,
                f"type is {spec.get('type')!r}, not {want_type}",
            )
        sports = spec.get("ports") or []
        c.expect(any(p.get("port") == port for p in sports), where, f"no port {port}")
        for p in sports:
            target = port_number(p.get("targetPort", p.get("port")), ports)
            c.expect(
                target == port,
                where,
                f"port {p.get('port')} targets {p.get('targetPort')!r} = {target!r}, not container port {port}",
            )


def check_pdb(by_kind, pod_labels, c):
    where, pdb = need(by_kind, "PodDisruptionBudget", "ostiary", c)
    if pdb is None:
        return
    where = f"{where} PodDisruptionBudget/ostiary"
    spec = pdb.get("spec") or {}
    c.expect(
        spec.get("minAvailable") == 2, where, f"minAvailable is {spec.get('minAvailable')!r}, not 2"
    )
    c.expect(
        isinstance(spec.get("minAvailable"), int) and spec["minAvailable"] < REPLICAS,
        where,
        "minAvailable leaves no replica to disrupt",
    )
    sel = (spec.get("selector") or {}).get("matchLabels") or {}
    c.expect(
        selects(sel, pod_labels),
        where,
        f"selector {sel} does not match the pod labels {pod_labels}",
    )


def check_secret(by_kind, c):
    where, sec = need(by_kind, "Secret", "ostiary-secrets", c)
    if sec is None:
        return
    where = f"{where} Secret/ostiary-secrets"
    c.expect(
        not sec.get("data"), where, "has data: the example carries placeholders in stringData only"
    )
    values = sec.get("stringData") or {}
    for name in SECRET_ENV:
        if not c.expect(name in values, where, f"no key {name}"):
            continue
        c.expect(
            "CHANGE" in str(values[name]).upper().replace(" ", "_"),
            where,
            f"{name} is not an obvious placeholder (CHANGE_ME)",
        )
    token = str(values.get("OSTIARY_ADMIN_TOKEN", ""))
    usable = len(token) >= MIN_ADMIN_TOKEN_LEN and all(0x21 <= ord(ch) <= 0x7E for ch in token)
    c.expect(
        not usable,
        where,
        "the placeholder OSTIARY_ADMIN_TOKEN would be accepted as a token; make it one Ostiary refuses",
    )
    c.expect(
        str(values.get("OSTIARY_STATE_STORE", "")).startswith("postgres://"),
        where,
        "OSTIARY_STATE_STORE is not a postgres:// URL",
    )
    c.expect(
        str(values.get("OSTIARY_STATE_REDIS", "")).startswith(("redis://", "rediss://")),
        where,
        "OSTIARY_STATE_REDIS is not a redis:// URL",
    )
    c.expect(
        ("Secret", "ostiary-keys") not in by_kind,
        "deploy/k8s",
        "Secret ostiary-keys is in the manifests: applying them would replace the shared keys",
    )


def under(path, parent):
    """`path` is strictly inside `parent` (both absolute)."""
    if not (os.path.isabs(path) and os.path.isabs(parent)):
        return False
    return os.path.commonpath([path, parent]) == parent and path != parent


def check_config(by_kind, facts, env, c):
    """The ConfigMap's ostiary.toml against the Deployment: ports, mounts, env."""
    where, cm = need(by_kind, "ConfigMap", "ostiary-config", c)
    text = ((cm or {}).get("data") or {}).get("ostiary.toml")
    if not c.expect(
        isinstance(text, str), f"{where} ConfigMap/ostiary-config", "no key ostiary.toml"
    ):
        return None
    where = f"{where} ConfigMap/ostiary-config ostiary.toml"
    try:
        config = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        c.fail(where, f"not TOML: {e}")
        return text
    listen, state = config.get("listen") or {}, config.get("state") or {}
    for field, port in (("proxy", PROXY_PORT), ("control", CONTROL_PORT)):
        c.expect(
            str(listen.get(field, "")).endswith(f":{port}")
            and str(listen.get(field)).startswith("0.0.0.0:"),
            where,
            f"listen.{field} is {listen.get(field)!r}, expected 0.0.0.0:{port}",
        )
    for field, var in (("store", "OSTIARY_STATE_STORE"), ("redis", "OSTIARY_STATE_REDIS")):
        c.expect(
            field not in state,
            where,
            f"state.{field} is in the config map; it carries a password and comes from {var}",
        )
    mounts = facts.get("mounts") or {}
    config_mount = mounts.get(CONFIG_PATH) or {}
    c.expect(
        config_mount.get("configmap") == "ostiary-config"
        and config_mount.get("sub_path") == "ostiary.toml",
        where,
        f"{CONFIG_PATH} is not the ostiary.toml of ConfigMap ostiary-config",
    )
    keys_dir = state.get("keys_dir")
    c.expect(
        (mounts.get(keys_dir) or {}).get("secret") == "ostiary-keys",
        where,
        f"state.keys_dir {keys_dir!r} is not where Secret ostiary-keys is mounted",
    )
    pdir = (config.get("policy") or {}).get("dir")
    c.expect(
        (mounts.get(pdir) or {}).get("configmap") == "ostiary-policies",
        where,
        f"policy.dir {pdir!r} is not where ConfigMap ostiary-policies is mounted",
    )
    sdir = str(state.get("dir", ""))
    c.expect(
        any(under(sdir, d) for d in facts.get("empty_dirs") or []),
        where,
        f"state.dir {sdir!r} is not a directory inside an emptyDir mount {facts.get('empty_dirs')} (the mount point itself is root's: Ostiary cannot make it 0700)",
    )
    vault = (config.get("broker") or {}).get("vault") or {}
    approle = ((vault.get("auth") or {}).get("approle")) or {}
    secret_env = approle.get("secret_id_env")
    c.expect(
        secret_env in env,
        where,
        f"broker.vault.auth.approle.secret_id_env {secret_env!r} is not set in the container's environment",
    )
    return text


def extract(by_kind, out, config_text, facts, c):
    out.mkdir(parents=True, exist_ok=True)
    if config_text is not None:
        (out / "ostiary.toml").write_text(config_text)
    where, cm = need(by_kind, "ConfigMap", "ostiary-policies", c)
    data = (cm or {}).get("data") or {}
    where = f"{where} ConfigMap/ostiary-policies"
    c.expect(any(k.endswith(".cedar") for k in data), where, "no *.cedar file")
    c.expect("tools.toml" in data, where, "no tools.toml")
    for key in data:
        c.expect(
            re.fullmatch(r"[A-Za-z0-9_.-]+", key) is not None and not key.startswith(".."),
            where,
            f"key {key!r} is not a plain file name",
        )
    # The kubelet's layout: the files live in a timestamped directory, `..data` points at it,
    # and each name is a symlink through `..data` (so an update is one atomic rename).
    pdir = out / "policies"
    if pdir.exists():
        shutil.rmtree(pdir)
    stamp = pdir / "..2025_01_01_00_00_00.000000000"
    stamp.mkdir(parents=True)
    for key, value in data.items():
        (stamp / key).write_text(value)
    os.symlink(stamp.name, pdir / "..data")
    for key in data:
        os.symlink(f"..data/{key}", pdir / key)
    (out / "deployment.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")


def check_k8s(k8s_dir, version, out, c):
    docs = load_manifests(k8s_dir, c)
    validate_schemas(docs, version, c)
    by_kind = index(docs, c)
    need(by_kind, "Namespace", NAMESPACE, c)
    facts, pod_labels = check_deployment(by_kind, c)
    check_services(by_kind, pod_labels, facts.get("ports") or {}, c)
    check_pdb(by_kind, pod_labels, c)
    check_secret(by_kind, c)
    config_text = check_config(by_kind, facts, facts.get("env") or {}, c)
    facts["kube_version"] = version
    extract(by_kind, out, config_text, facts, c)
    return len(docs)


# ---------------------------------------------------------------- systemd


def parse_unit(text):
    """systemd's INI: sections of (key, value) in order; keys may repeat; `\\` continues."""
    sections, current, pending = {}, None, ""
    for raw in text.splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line.startswith(("#", ";")):
            continue
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
        elif "=" in line and current is not None:
            key, value = line.split("=", 1)
            current.append((key.strip(), value.strip()))
    return sections


def last(section, key):
    values = [v for k, v in section if k == key]
    return values[-1] if values else None


def seconds(span):
    """A systemd time span ("45s", "1min 30s", "45") in seconds, or None."""
    units = {
        "": 1,
        "s": 1,
        "sec": 1,
        "second": 1,
        "seconds": 1,
        "m": 60,
        "min": 60,
        "minute": 60,
        "minutes": 60,
        "h": 3600,
        "hr": 3600,
        "hour": 3600,
        "hours": 3600,
        "ms": 0.001,
        "msec": 0.001,
    }
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span or "")
    if not parts or re.sub(r"[\d.\sa-z]", "", span):
        return None
    total = 0.0
    for number, unit in parts:
        if unit not in units:
            return None
        total += float(number) * units[unit]
    return total


def check_unit_text(path, c):
    where = path.name
    sections = parse_unit(path.read_text())
    svc = sections.get("Service")
    if not c.expect(svc is not None, where, "no [Service] section"):
        return
    c.expect(
        last(svc, "ExecStart") == " ".join(EXEC_ARGS),
        where,
        f"ExecStart is {last(svc, 'ExecStart')!r}, expected {' '.join(EXEC_ARGS)!r}",
    )
    user = last(svc, "User")
    c.expect(
        user not in (None, "", "root", "0"), where, f"User is {user!r}: a dedicated user is needed"
    )
    c.expect(
        last(svc, "KillSignal") == "SIGTERM",
        where,
        f"KillSignal is {last(svc, 'KillSignal')!r}, not SIGTERM",
    )
    stop = seconds(last(svc, "TimeoutStopSec"))
    c.expect(
        stop is not None and stop > DRAIN_BOUND_S,
        where,
        f"TimeoutStopSec is {last(svc, 'TimeoutStopSec')!r}: it must be longer than the drain bound ({DRAIN_BOUND_S} s)",
    )
    c.expect(
        last(svc, "Restart") == "on-failure",
        where,
        f"Restart is {last(svc, 'Restart')!r}, not on-failure",
    )
    c.expect(
        last(svc, "EnvironmentFile") == "-/etc/ostiary/env",
        where,
        f"EnvironmentFile is {last(svc, 'EnvironmentFile')!r}, not -/etc/ostiary/env",
    )
    c.expect(
        last(svc, "StateDirectory") == "ostiary",
        where,
        f"StateDirectory is {last(svc, 'StateDirectory')!r}, not ostiary",
    )
    rw = " ".join(v for k, v in svc if k == "ReadWritePaths").split()
    c.expect(
        "/var/lib/ostiary" in rw, where, f"ReadWritePaths {rw} does not include /var/lib/ostiary"
    )
    hardening = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "ProtectKernelTunables": "yes",
        "ProtectKernelModules": "yes",
        "ProtectControlGroups": "yes",
        "RestrictNamespaces": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "SystemCallArchitectures": "native",
        "CapabilityBoundingSet": "",
    }
    for key, want in hardening.items():
        got = last(svc, key)
        c.expect(got == want, where, f"{key} is {got!r}, expected {want!r}")
    c.expect(any(k == "SystemCallFilter" for k, _ in svc), where, "no SystemCallFilter")


def check_unit_with_systemd(path, c):
    """`systemd-analyze verify` and `security --offline`, on a copy whose ExecStart binary is a
    stub (the test machine has no /usr/local/bin/ostiary; verify refuses a missing one). Any
    output of verify is a failure: it reports unknown keys and bad values with exit code 0."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        print(f"note: systemd-analyze is not installed: {path.name} was checked by parsing only")
        return
    with tempfile.TemporaryDirectory() as tmp:
        stub = Path(tmp) / "ostiary"
        stub.write_text("#!/bin/sh\nexit 0\n")
        stub.chmod(0o755)
        text = path.read_text()
        if EXEC_ARGS[0] not in text:
            c.fail(path.name, f"{EXEC_ARGS[0]} does not appear in the unit")
            return
        unit = Path(tmp) / path.name
        unit.write_text(text.replace(EXEC_ARGS[0], str(stub)))
        run = subprocess.run(
            [tool, "verify", "--man=no", str(unit)],
            capture_output=True,
            text=True,
            cwd=tmp,
            timeout=60,
        )
        report = (run.stdout + run.stderr).strip()
        c.expect(
            run.returncode == 0 and not report,
            path.name,
            f"systemd-analyze verify: exit {run.returncode}: {report or '(no output)'}",
        )
        helptext = subprocess.run(
            [tool, "security", "--help"], capture_output=True, text=True, timeout=60
        ).stdout
        if "--offline" in helptext and "--threshold" in helptext:
            # 100 = fully exposed; 20 is systemd's "OK" band at its upper edge (2.0).
            run = subprocess.run(
                [tool, "security", "--offline=yes", "--threshold=20", "--no-pager", str(unit)],
                capture_output=True,
                text=True,
                cwd=tmp,
                timeout=60,
            )
            summary = [line for line in run.stdout.splitlines() if "Overall exposure" in line]
            c.expect(
                run.returncode == 0,
                path.name,
                f"systemd-analyze security: exposure above 2.0: {summary or run.stderr.strip()}",
            )
        else:
            print("note: this systemd-analyze has no `security --offline`: exposure not scored")


def check_systemd(systemd_dir, c):
    unit = Path(systemd_dir) / "ostiary.service"
    if not c.expect(unit.is_file(), str(unit), "missing"):
        return
    check_unit_text(unit, c)
    check_unit_with_systemd(unit, c)
    config = Path(systemd_dir) / "ostiary.toml"
    if not c.expect(config.is_file(), str(config), "missing"):
        return
    try:
        parsed = tomllib.loads(config.read_text())
    except tomllib.TOMLDecodeError as e:
        c.fail(config.name, f"not TOML: {e}")
        return
    state_dir = (parsed.get("state") or {}).get("dir")
    c.expect(
        state_dir == "/var/lib/ostiary",
        config.name,
        f"state.dir is {state_dir!r}, not the unit's StateDirectory /var/lib/ostiary",
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "out", type=Path, help="where ostiary.toml, policies/ and deployment.json are written"
    )
    parser.add_argument("--k8s-dir", type=Path, default=ROOT / "deploy" / "k8s")
    parser.add_argument("--systemd-dir", type=Path, default=ROOT / "deploy" / "systemd")
    parser.add_argument("--kube-version", default="1.30")
    opts = parser.parse_args()

    c = Checker()
    count = check_k8s(opts.k8s_dir, opts.kube_version, opts.out, c)
    check_systemd(opts.systemd_dir, c)
    if c.failures:
        for line in c.failures:
            print(line, file=sys.stderr)
        print(f"check_deploy.py: {len(c.failures)} check(s) failed", file=sys.stderr)
        return 1
    print(
        f"ok: {count} manifests in {opts.k8s_dir} valid for Kubernetes {opts.kube_version} "
        f"(kubernetes-validate {kubernetes_validate.__version__}, strict) and consistent"
    )
    print(f"ok: {opts.systemd_dir / 'ostiary.service'} and ostiary.toml")
    print(f"ok: extracted ostiary.toml, policies/ and deployment.json into {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
