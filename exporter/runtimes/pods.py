"""The kubelet's pods' facts, pure: their containers' cgroups, their key, the kubelet's log layout, the CRI format.

- Cgroups: with the systemd driver `/kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid>.slice/<scope>`
  (no QoS slice for guaranteed pods; `_` for the uid's `-`; a prefix when the kubelet's cgroup root is not the
  top: kind's `kubelet-kubepods-...`), the scope being the CRI runtime's: `cri-containerd-<id>.scope`,
  `crio-<id>.scope`, or Docker's or Podman's own; with cgroupfs `/kubepods/<qos>/pod<uid>/<id>` (containerd,
  Docker) or `.../pod<uid>/crio-<id>` (CRI-O). Conmon's scope (`crio-conmon-<id>.scope`) is not the container's.
  A pod's container is the pod's, whichever engine runs it: its row comes first in the registry.
- Key: `k8s/<namespace>/<pod>/<container>` (`kubernetes_key`).
- Names and logs: the kubelet's container log symlinks `<pod>_<namespace>_<container>-<id>.log` (`LOG_LINK`)
  whose target `.../<namespace>_<pod>_<uid>/<container>/N.log` also names the pod's uid (`uid_of_link_target`),
  and the pod log directories `<namespace>_<pod>_<uid>/<container>/<n>.log` (`POD_DIRECTORY`, `RESTART_LOG`),
  `n` the container's restart count; the kubelet rotates `<n>.log` to `<n>.log.<YYYYmmdd-HHMMSS>` and gzips
  the older rotated files to `.gz` (`rotated_files`).
- The CRI log format the kubelet's runtimes write (containerd, CRI-O): `runtimes.parse_cri_line`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from vllm_xpu_exporter.parsers.workloads import MAX_NAME_LENGTH
from vllm_xpu_exporter.runtimes import CONTAINER_ID, ID, ContainerCgroup
from vllm_xpu_exporter.runtimes import docker, podman

KIND = "k8s"
JOURNAL = None
CONTAINERD = "containerd"
CRIO = "crio"

_CRIO = re.compile(rf"crio-{ID}(?:\.scope)?")
# The scopes of pods' containers, by engine: the CRI runtimes', and Docker's (cri-dockerd) and Podman's own.
_SCOPES = ((docker.SCOPE, docker.ENGINE), (podman.SCOPE, podman.ENGINE),
           (re.compile(rf"cri-containerd-{ID}\.scope"), CONTAINERD), (_CRIO, CRIO))
# Static pods' uids are a hash without dashes.
_POD_SLICE = re.compile(r"(?:[a-z0-9_.-]*-)?kubepods(?:-burstable|-besteffort)?-pod([0-9a-f][0-9a-f_]{0,63})\.slice")
_POD_CGROUP = re.compile(r"pod([0-9a-f][0-9a-f-]{0,63})")

LOG_LINK = re.compile(rf"([^_/]+)_([^_/]+)_([^_/]+)-{ID}\.log")
"""<pod>_<namespace>_<container>-<id>.log: none of the names can hold `_`."""
POD_DIRECTORY = re.compile(r"([^_/]+)_([^_/]+)_([0-9a-f][0-9a-f-]{0,63})")
"""<namespace>_<pod>_<uid>"""
RESTART_LOG = re.compile(r"(\d{1,9})\.log")
_ROTATION_STAMP = re.compile(r"\d{8}-\d{6}")

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def container_of_scope(elements: Sequence[str], index: int) -> ContainerCgroup | None:
    pod = _POD_SLICE.fullmatch(elements[index - 1]) if index > 0 else None
    if pod is None:
        return None
    for pattern, engine in _SCOPES:
        if match := pattern.fullmatch(elements[index]):
            return ContainerCgroup(engine, match.group(1), pod.group(1).replace("_", "-"))
    return None


def container_of_cgroupfs(elements: Sequence[str], index: int) -> ContainerCgroup | None:
    pod = _POD_CGROUP.fullmatch(elements[index - 1])
    if pod is None or not any(e == "kubepods" or e.endswith("kubepods") for e in elements[:index - 1]):
        return None
    if match := CONTAINER_ID.fullmatch(elements[index]):
        return ContainerCgroup(CONTAINERD, match.group(0), pod.group(1))  # or dockershim: alike here
    if match := _CRIO.fullmatch(elements[index]):
        return ContainerCgroup(CRIO, match.group(1), pod.group(1))
    return None


def names_container(container: ContainerCgroup) -> bool:
    return container.pod_uid is not None


def kubernetes_key(namespace: str, pod: str, container: str) -> str | None:
    """`k8s/<namespace>/<pod>/<container>` for a container of a pod, or None unless the namespace and the
    container are DNS-1123 labels (at most 63 characters) and the pod a DNS-1123 subdomain (253)."""
    if not all(isinstance(part, str) for part in (namespace, pod, container)):
        return None
    if not (_dns_label_ok(namespace) and _dns_label_ok(container)):
        return None
    if len(pod) > MAX_NAME_LENGTH or not _DNS_SUBDOMAIN.fullmatch(pod):
        return None
    return f"{KIND}/{namespace}/{pod}/{container}"


def uid_of_link_target(target: str, namespace: str, pod: str, container: str) -> str | None:
    """The pod uid in a log symlink's target `.../<namespace>_<pod>_<uid>/<container>/N.log`, None when it
    does not say."""
    parts = target.rstrip("/").split("/")
    if len(parts) < 3 or parts[-2] != container:
        return None
    match = POD_DIRECTORY.fullmatch(parts[-3])
    if match is None or match.group(1) != namespace or match.group(2) != pod:
        return None
    return match.group(3)


def rotated_files(live: str, siblings: Sequence[str]) -> list[str]:
    """The kubelet's rotated files of `live` among `siblings`, oldest first: `live.<YYYYmmdd-HHMMSS>[.gz]` (not
    `.tmp`); a gzipped and a plain copy of the same file: the plain one (the kubelet removes it once gzipped)."""
    stamped: dict[str, str] = {}
    for path in siblings:
        suffix = path[len(live) + 1:]
        stamp = suffix[:-3] if suffix.endswith(".gz") else suffix
        if _ROTATION_STAMP.fullmatch(stamp) and (stamp not in stamped or not path.endswith(".gz")):
            stamped[stamp] = path
    return [stamped[stamp] for stamp in sorted(stamped)]


def _dns_label_ok(name: str) -> bool:
    return 0 < len(name) <= 63 and _DNS_LABEL.fullmatch(name) is not None
