"""The hub's service account on the test control plane, with exactly the RBAC that
hub_config/kubernetes-rbac.yaml grants it, and a kubeconfig with its token: what the pool
service runs with in zero-to-jupyterhub's hub pod."""

import base64
import copy
import time
from pathlib import Path

import yaml

from kube.rest import KubeError, KubeREST

HUB_CONFIG = Path(__file__).resolve().parents[1] / "hub_config"


class Account:
    """The hub's service account in its own namespace, with hub_config/kubernetes-rbac.yaml
    applied (its namespace and cluster-wide names made this module's own)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.namespace = cluster.namespace("gpushare")
        self.suffix = self.namespace
        admin = cluster.api
        admin.post(f"/api/v1/namespaces/{self.namespace}/serviceaccounts",
                   {"metadata": {"name": "hub"}})
        self.cluster_objects = []
        for doc in yaml.safe_load_all((HUB_CONFIG / "kubernetes-rbac.yaml").read_text()):
            doc = copy.deepcopy(doc)
            for subject in doc.get("subjects", []):
                subject["namespace"] = self.namespace
            kind = doc["kind"]
            if kind.startswith("Cluster"):
                doc["metadata"]["name"] += f"-{self.suffix}"
                if kind == "ClusterRoleBinding":
                    doc["roleRef"]["name"] += f"-{self.suffix}"
                path = f"/apis/rbac.authorization.k8s.io/v1/{kind.lower()}s"
                self.cluster_objects.append(f"{path}/{doc['metadata']['name']}")
            else:
                path = (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{self.namespace}/"
                        f"{kind.lower()}s")
            admin.post(path, doc)
        self.token = self._token()
        self.api = KubeREST(cluster.url, self.token)
        self.kubeconfig = cluster.control_plane.workdir / f"kubeconfig-sa-{self.namespace}"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: sim\n  cluster:\n    server: {cluster.url}\n"
            "    insecure-skip-tls-verify: true\n"
            f"users:\n- name: hub\n  user:\n    token: {self.token}\n"
            "contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: hub\n"
            "current-context: sim\n")

    def _token(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sa = self.cluster.api.get(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/hub")
            for ref in sa.get("secrets") or []:
                secret = self.cluster.api.get(
                    f"/api/v1/namespaces/{self.namespace}/secrets/{ref['name']}")
                if secret.get("data", {}).get("token"):
                    return base64.b64decode(secret["data"]["token"]).decode()
            time.sleep(0.1)
        raise TimeoutError("the hub service account got no token")

    def clear_pods(self):
        admin = self.cluster.api
        pods = admin.get(f"/api/v1/namespaces/{self.namespace}/pods")["items"]
        for pod in pods:
            try:
                admin.delete(f"/api/v1/namespaces/{self.namespace}/pods/"
                             f"{pod['metadata']['name']}", {"gracePeriodSeconds": 0})
            except KubeError:
                pass

    def close(self):
        for path in self.cluster_objects:
            self.cluster.api.delete(path)
        self.cluster.api.delete(f"/api/v1/namespaces/{self.namespace}")
