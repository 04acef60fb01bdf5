"""The plan for containers, in the form each runtime takes (`vllm-xpu-plan --format compose|podman|kustomize`):

- `compose`: per Compose project, an override file that gives each planned service its `command:` (the
  container's `Config.Cmd` as Docker keeps it) with the planned `--gpu-memory-utilization` and
  `--kv-cache-memory-bytes`, and the plan's label (`runtimes.PLAN_LABEL`: the budget, which Docker records with
  the container, for "Is the plan applied?"); loaded (by the caller's `verify`, `docker-compose config` over the
  project's own files) before it is printed;
- `podman`: per container, the command line that created it (Podman's `CreateCommand`) with the planned flags
  after its command, `--replace`, and the plan as a label and an annotation (Podman records annotations in the
  container's OCI configuration, where the exporter reads it), to run as it is. Podman has no dry run to load
  it with. (Quadlet, which would take a drop-in, came with Podman 4.4: Debian 12's 4.3 has none.)
- `kustomize`: an overlay over the user's kustomization whose JSON patches replace each pod container's args
  (the workload that makes the pod found in the rendered base by its controller's pod names); rendered and
  checked by the caller before it is written.

A container whose command cannot be read or edited, or whose output does not load, is named with why: the
planner then exits 3 and prints nothing of that runtime.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import yaml

from vllm_xpu_exporter import __version__
from vllm_xpu_exporter.planner import execstart
from vllm_xpu_exporter.planner.execstart import NotEditable
from vllm_xpu_exporter.planner.plans import UnitPlan
from vllm_xpu_exporter.runtimes import PLAN_LABEL
from vllm_xpu_exporter.sources.container_commands import ContainerCommand, runtime_of_key

PROG = "vllm-xpu-plan"
CONTAINER_FORMATS = {"compose": "docker", "podman": "podman", "kustomize": "k8s"}
"""The output forms for containers, and the runtime (the key's first part) each covers."""


def format_of(key: str) -> str:
    """The --format that writes the plan of workload `key` (a unit's: systemd)."""
    runtime = runtime_of_key(key)
    if runtime == "systemd":
        return "systemd"
    return next((form for form, covered in CONTAINER_FORMATS.items() if covered == runtime),
                f"none ({runtime}: set the printed --kv-cache-memory-bytes in its args by hand)")


@dataclass(frozen=True)
class Rendered:
    """What a format gives: its text (empty when nothing could be made) and, per workload it could not
    cover, why."""

    text: str
    refused: tuple[str, ...]


def planned_flags(plan: UnitPlan) -> tuple[str, ...]:
    return ("--gpu-memory-utilization", f"{plan.gpu_memory_utilization:g}",
            "--kv-cache-memory-bytes", str(plan.kv_cache_memory_bytes))


def plan_record(plan: UnitPlan) -> str:
    """The plan's label or annotation, `KEY=VALUE`."""
    return f"{PLAN_LABEL}={plan.kv_cache_memory_bytes}"


def compose_command(plan: UnitPlan, command: ContainerCommand) -> tuple[str, ...]:
    """The service's `command:`: the container's Cmd with its own planned flags dropped and the plan's appended
    (vLLM's words may start in the entrypoint, e.g. `vllm serve` there and the model in the command)."""
    what = f"the command of container {command.name}"
    execstart.check_editable(execstart.Command("", (*command.entrypoint, *command.cmd),
                                               (*command.entrypoint, *command.cmd)), what)
    return execstart.planned_words(command.cmd, planned_flags(plan), what, checked=True)


def podman_command_line(plan: UnitPlan, command: ContainerCommand) -> str:
    """The container's create command with the plan's flags after its command, and `--replace` and the plan's
    label and annotation (an earlier plan's replaced) after its `run` (or `create`): its global options
    (`--root`, `--log-level`, ...) kept before it."""
    words = command.create_command
    verb = next((index for index, word in enumerate(words[1:], 1) if word in ("run", "create")), None)
    if verb is None:
        raise NotEditable(f"podman made container {command.name} with `{shlex.join(words)[:200]}`, not run/create: "
                          f"add {' '.join(planned_flags(plan))} to its command by hand")
    edited = execstart.planned_words(words, planned_flags(plan), f"the create command of container {command.name}")
    options = [*(() if "--replace" in words else ("--replace",)),
               "--label", plan_record(plan), "--annotation", plan_record(plan)]
    return shlex.join([*edited[:verb + 1], *options, *_without_plan_records(edited[verb + 1:])])


def _without_plan_records(words: Sequence[str]) -> list[str]:
    """`words` without an earlier plan's `--label`/`--annotation` (`--label KEY=N` or `--label=KEY=N`)."""
    kept: list[str] = []
    skip = False
    for index, word in enumerate(words):
        if skip:
            skip = False
            continue
        flag, equals, value = word.partition("=")
        if flag in ("--label", "--annotation", "-l") and not equals and index + 1 < len(words) \
                and words[index + 1].startswith(PLAN_LABEL + "="):
            skip = True
            continue
        if flag in ("--label", "--annotation", "-l") and equals and value.startswith(PLAN_LABEL + "="):
            continue
        kept.append(word)
    return kept


def render_compose(plans: Sequence[UnitPlan], commands: dict[str, ContainerCommand | str],
                   verify: Callable[[ContainerCommand, str], str | None]) -> Rendered:
    """One override per Compose project (`verify(any container of it, text)`: None when it loads, else what the
    tool said)."""
    refused: list[str] = []
    projects: dict[tuple[str, tuple[str, ...], str], dict[str, tuple[UnitPlan, ContainerCommand]]] = {}
    for plan in plans:
        command = commands[plan.unit]
        if isinstance(command, str):
            refused.append(f"{plan.unit}: {command}")
            continue
        if not (command.compose_project and command.compose_service and command.compose_files):
            refused.append(f"{plan.unit}: not started by Compose (no Compose labels); use --format podman for "
                           f"Podman, or add {' '.join(planned_flags(plan))} to its command by hand")
            continue
        project = projects.setdefault((command.compose_project, command.compose_files, command.compose_directory), {})
        project[command.compose_service] = (plan, command)
    documents = []
    for (project, files, directory), services in projects.items():
        try:
            document = {"services": {service: {"command": list(compose_command(plan, command)),
                                               "labels": {PLAN_LABEL: str(plan.kv_cache_memory_bytes)}}
                                     for service, (plan, command) in services.items()}}
        except NotEditable as error:
            refused.append(f"project {project}: {error}")
            continue
        heads = [f"# {PROG} {__version__}: the planned KV budget of Compose project {project}'s services "
                 f"({', '.join(f'{s}: footprint {p.footprint.total_bytes} bytes, KV {p.kv_cache_memory_bytes}' for s, (p, _) in services.items())})",
                 f"# apply: docker-compose -p {shlex.quote(project)} --project-directory {shlex.quote(directory)} "
                 + " ".join(f"-f {shlex.quote(f)}" for f in files) + " -f THIS-FILE up -d"]
        text = "\n".join(heads) + "\n" + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
        problem = verify(next(iter(services.values()))[1], text)
        if problem is not None:
            refused.append(f"project {project}: {problem}")
            continue
        documents.append(text)
    return Rendered("---\n".join(documents), tuple(refused))


def render_podman(plans: Sequence[UnitPlan], commands: dict[str, ContainerCommand | str]) -> Rendered:
    refused: list[str] = []
    lines = [f"# {PROG} {__version__}: per Podman container, its create command with the planned KV budget "
             f"(run each as it is; not loaded before: Podman has no dry run)"]
    for plan in plans:
        command = commands[plan.unit]
        if isinstance(command, str):
            refused.append(f"{plan.unit}: {command}")
            continue
        try:
            lines.append(podman_command_line(plan, command))
        except NotEditable as error:
            refused.append(f"{plan.unit}: {error}")
    return Rendered("\n".join(lines) + "\n" if len(lines) > 1 else "", tuple(refused))


# --- kustomize: a patch of each pod's container's args, over the user's own kustomization ----------------------

WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "Pod")


def _pod_of(kind: str, name: str, pod: str) -> bool:
    """Whether pod `pod` is one a workload of `kind` named `name` makes, by the names its controller gives."""
    if kind == "Pod":
        return pod == name
    suffix = pod[len(name) + 1:] if pod.startswith(name + "-") else None
    if suffix is None:
        return False
    if kind == "StatefulSet":
        return suffix.isdigit()
    if kind == "Deployment":
        hash_, dash, tail = suffix.partition("-")
        return bool(dash) and hash_.isalnum() and tail.isalnum() and len(tail) == 5
    return suffix.isalnum() and len(suffix) == 5


def _containers_of(document: dict) -> tuple[str, list] | None:
    """The JSON pointer of a workload's containers list and the list."""
    spec = document.get("spec") if isinstance(document.get("spec"), dict) else {}
    if document.get("kind") == "Pod":
        return "/spec/containers", spec.get("containers") or []
    template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
    pod_spec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
    return "/spec/template/spec/containers", pod_spec.get("containers") or []


@dataclass(frozen=True)
class ArgsPatch:
    """One container's args replaced: in workload `kind`/`name` of `namespace`, at JSON pointer `path`."""

    kind: str
    name: str
    namespace: str
    path: str
    args: tuple[str, ...]
    unit: str


def kustomize_patch(plan: UnitPlan, documents: Sequence[object]) -> ArgsPatch:
    """The patch of the args of pod container `plan.unit` (`k8s/NAMESPACE/POD/CONTAINER`) in the rendered
    kustomization `documents`: the workload that makes that pod, its container of that name, its args with the
    planner's flags dropped and the plan's appended. Raises NotEditable when no one workload is found or its
    command cannot take the flags."""
    _, namespace, pod, container = plan.unit.split("/", 3)
    found = []
    for document in documents:
        if not isinstance(document, dict) or document.get("kind") not in WORKLOAD_KINDS:
            continue
        metadata = document.get("metadata") if isinstance(document.get("metadata"), dict) else {}
        name = metadata.get("name")
        if not isinstance(name, str) or (metadata.get("namespace") or "default") != namespace \
                or not _pod_of(document["kind"], name, pod):
            continue
        path, listed = _containers_of(document)
        for index, spec in enumerate(listed):
            if isinstance(spec, dict) and spec.get("name") == container:
                found.append((document["kind"], name, f"{path}/{index}/args", spec))
    if len(found) != 1:
        what = "no workload" if not found else f"{len(found)} workloads"
        raise NotEditable(f"{what} of the kustomization makes pod {pod}'s container {container} in namespace "
                          f"{namespace}: add {' '.join(planned_flags(plan))} to its args by hand")
    kind, name, path, spec = found[0]
    command, args = _strings_of(spec.get("command")), _strings_of(spec.get("args"))
    what = f"the command of pod container {container} ({kind} {name})"
    execstart.check_editable(execstart.Command("", (*command, *args), (*command, *args)), what)
    return ArgsPatch(kind, name, namespace, path, execstart.planned_words(args, planned_flags(plan), what,
                                                                          checked=True), plan.unit)


def _strings_of(value: object) -> tuple[str, ...]:
    return tuple(str(word) for word in value) if isinstance(value, list) else ()


def render_kustomization(patches: Sequence[ArgsPatch], base: str) -> str:
    """An overlay over `base` (as its `resources` names it: relative to the overlay's directory) with one JSON
    patch per container."""
    document = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": [base],
                "patches": [{"target": {"kind": p.kind, "name": p.name, "namespace": p.namespace},
                             "patch": json.dumps([{"op": "add", "path": p.path, "value": list(p.args)}])}
                            for p in patches]}
    head = (f"# {PROG} {__version__}: the planned KV budget of each pod container, over {base} "
            f"({', '.join(p.unit for p in patches)})\n")
    return head + yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=1 << 16)


def applied_args(documents: Sequence[object], patch: ArgsPatch) -> tuple[str, ...] | None:
    """The args the rendered overlay gives the patched container (to check that the patch took)."""
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == patch.kind and \
                isinstance(document.get("metadata"), dict) and document["metadata"].get("name") == patch.name:
            path, listed = _containers_of(document)
            index = int(patch.path.removeprefix(path + "/").split("/")[0])
            return _strings_of(listed[index].get("args")) if index < len(listed) else None
    return None
