"""pytest fixtures for the real control plane (registered by tests/conftest.py).

- ``kube_cluster`` (session): a started KubeCluster (harness.py) with no nodes. The first use on a
  machine builds the binaries (~5 min, cached under ~/.cache/jupyter-gpushare/kube/); when they
  cannot be built the test is skipped with the reason and the fix.
- ``kube`` (per test): a KubeTest — its own namespace, and nodes that are removed afterwards.

Mark such tests ``@pytest.mark.kube``."""

from __future__ import annotations

import pytest

from .cluster import ToolchainError, ensure_binaries
from .harness import KubeCluster
from .kubelet import KubeletSimulator
from .rest import KubeError

TEST_LABEL = "sim.gpushare.jupyter.org/test"


class KubeTest:
    """One test's slice of the shared cluster: ``namespace`` (pods can be created at once),
    ``add_node(name, gpus=..., shared_gpus=..., labels=...)`` (same arguments as
    KubeletSimulator.add_node; the node also gets ``TEST_LABEL: namespace`` so
    ``node_selector`` picks only this test's nodes) and the cluster's helpers."""

    def __init__(self, cluster: KubeCluster, namespace: str):
        self.cluster = cluster
        self.namespace = namespace
        self.nodes: list[str] = []
        self.node_selector = {TEST_LABEL: namespace}

    @property
    def kubelet(self) -> KubeletSimulator:
        return self.cluster.kubelet

    @property
    def api(self):
        return self.cluster.api

    @property
    def kubeconfig(self):
        return self.cluster.kubeconfig

    def add_node(self, name: str, **options) -> dict:
        options["labels"] = {**self.node_selector, **(options.get("labels") or {})}
        node = self.kubelet.add_node(name, **options)
        self.nodes.append(name)
        return node

    def create_pod(self, manifest: dict) -> dict:
        return self.api.post(f"/api/v1/namespaces/{self.namespace}/pods", manifest)

    def delete_pod(self, name: str, grace: int | None = None) -> dict:
        body = {} if grace is None else {"gracePeriodSeconds": grace}
        return self.api.delete(f"/api/v1/namespaces/{self.namespace}/pods/{name}", body)

    def wait_pod(self, name: str, until, timeout: float = 20):
        return self.cluster.wait_pod(self.namespace, name, until, timeout)

    def events(self, name: str) -> list[dict]:
        return self.cluster.events(self.namespace, name)

    def logs(self, name: str, **query) -> str:
        return self.cluster.logs(self.namespace, name, **query)

    def cleanup(self):
        for name in self.nodes:
            if name in self.kubelet.nodes:
                self.kubelet.remove_node(name)
        try:
            self.api.delete(f"/api/v1/namespaces/{self.namespace}")
        except KubeError:
            pass


def pytest_configure(config):
    # Everything here talks TLS to self-signed loopback servers on purpose.
    config.addinivalue_line("filterwarnings",
                            "ignore::urllib3.exceptions.InsecureRequestWarning")


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory):
    try:
        bin_dir = ensure_binaries()
    except ToolchainError as e:
        pytest.skip(f"NO KUBERNETES CONTROL PLANE — kube tests skipped: {e}")
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"), bin_dir=bin_dir)
    with cluster:
        yield cluster


@pytest.fixture
def kube(kube_cluster):
    test = KubeTest(kube_cluster, kube_cluster.namespace("t"))
    yield test
    test.cleanup()
