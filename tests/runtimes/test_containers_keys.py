"""vllm_xpu_exporter.runtimes' keys: the `unit` keys of containers and pods' containers, shared by the processes
collector and the journal side; names are untrusted, so what the engines would refuse gives no key."""

from __future__ import annotations

import pytest

from vllm_xpu_exporter.parsers.workloads import KIND_SYSTEMD
from vllm_xpu_exporter.runtimes.docker import KIND as KIND_DOCKER
from vllm_xpu_exporter.runtimes.docker import docker_key
from vllm_xpu_exporter.runtimes.podman import KIND as KIND_PODMAN
from vllm_xpu_exporter.runtimes.podman import podman_key
from vllm_xpu_exporter.runtimes.pods import KIND as KIND_KUBERNETES
from vllm_xpu_exporter.runtimes.pods import kubernetes_key
from vllm_xpu_exporter.runtimes.registry import kind_of_key

pytestmark = pytest.mark.fast  # the pure core (pyproject.toml's markers; `pytest -m fast`)


def test_docker_key():
    assert docker_key("vllm-chat-1") == "docker/vllm-chat-1"
    assert docker_key("/vllm-chat-1") == "docker/vllm-chat-1"  # config.v2.json's Name
    assert docker_key("a.b_c-D9") == "docker/a.b_c-D9"


def test_podman_key():
    assert podman_key("vllm_chat") == "podman/vllm_chat"
    assert podman_key("/vllm_chat") is None  # Podman's names have no leading slash


def test_kubernetes_key():
    assert kubernetes_key("inference", "vllm-chat-7d9f-x2x", "vllm") == "k8s/inference/vllm-chat-7d9f-x2x/vllm"
    assert kubernetes_key("ns", "a.b.c", "c") == "k8s/ns/a.b.c/c"


@pytest.mark.parametrize("name", [
    "", "/", "//x", "-x", ".x", "_x", "a b", "a/b", 'a"b', "a\nb", "a\n", "a\\b", "a{b}", "ä", "x" * 254,
    "١٢", "a\x00b", None, 3,
])
def test_container_names_refused(name):
    assert docker_key(name) is None
    assert podman_key(name) is None


@pytest.mark.parametrize(("namespace", "pod", "container"), [
    ("", "p", "c"), ("ns", "", "c"), ("ns", "p", ""), ("NS", "p", "c"), ("ns", "P", "c"), ("ns", "p", "C"),
    ("n.s", "p", "c"), ("ns", "p", "c.d"), ("-ns", "p", "c"), ("ns", "p-", "c"), ("ns", "p..q", "c"),
    ("n" * 64, "p", "c"), ("ns", "p" * 254, "c"), ("ns", "p", "c" * 64), ("ns", "p/q", "c"),
    ("ns", "p", "c\n"), ("ns", None, "c"),
])
def test_kubernetes_names_refused(namespace, pod, container):
    assert kubernetes_key(namespace, pod, container) is None


def test_longest_names_accepted():
    assert docker_key("x" * 253) == "docker/" + "x" * 253
    assert kubernetes_key("n" * 63, "p" * 253, "c" * 63) is not None


def test_kind_of_key():
    assert kind_of_key(docker_key("a1")) == KIND_DOCKER
    assert kind_of_key(podman_key("a1")) == KIND_PODMAN
    assert kind_of_key(kubernetes_key("ns", "p", "c")) == KIND_KUBERNETES
    assert kind_of_key("vllm-xpu-chat.service") == KIND_SYSTEMD
    assert kind_of_key("docker-4f2a.scope") == KIND_SYSTEMD
    assert kind_of_key("4f2a9c") == KIND_SYSTEMD
