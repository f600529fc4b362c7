"""Service accounts on the test control plane with exactly the RBAC that hub_config/ grants
them, and kubeconfigs with their tokens: the hub's (hub_config/kubernetes-rbac.yaml), what
the pool service runs with in zero-to-jupyterhub's hub pod, and the node agent's
(hub_config/kubernetes-agent.yaml)."""

import base64
import copy
import time
from pathlib import Path

import yaml

from kube.rest import KubeError, KubeREST

HUB_CONFIG = Path(__file__).resolve().parents[1] / "hub_config"
RBAC_KINDS = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


class _Account:
    """A service account ``name`` in ``namespace`` with the RBAC objects of ``rbac_file``
    (their namespace and cluster-wide names made this account's own)."""

    def __init__(self, cluster, namespace: str, name: str, rbac_file: str):
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.suffix = namespace
        admin = cluster.api
        self.cluster_objects = []
        docs = [d for d in yaml.safe_load_all((HUB_CONFIG / rbac_file).read_text())
                if d and d["kind"] in RBAC_KINDS]
        if not any(d["kind"] == "ServiceAccount" for d in docs):
            docs.insert(0, {"apiVersion": "v1", "kind": "ServiceAccount",
                            "metadata": {"name": name}})
        for doc in docs:
            doc = copy.deepcopy(doc)
            for subject in doc.get("subjects", []):
                subject["namespace"] = self.namespace
            kind = doc["kind"]
            if kind == "ServiceAccount":
                admin.post(f"/api/v1/namespaces/{self.namespace}/serviceaccounts", doc)
                continue
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
        self.kubeconfig = cluster.control_plane.workdir / f"kubeconfig-{name}-{self.namespace}"
        self.kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: sim\n  cluster:\n    server: {cluster.url}\n"
            "    insecure-skip-tls-verify: true\n"
            f"users:\n- name: {name}\n  user:\n    token: {self.token}\n"
            f"contexts:\n- name: sim\n  context:\n    cluster: sim\n    user: {name}\n"
            "current-context: sim\n")

    def _token(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            sa = self.cluster.api.get(
                f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{self.name}")
            for ref in sa.get("secrets") or []:
                secret = self.cluster.api.get(
                    f"/api/v1/namespaces/{self.namespace}/secrets/{ref['name']}")
                if secret.get("data", {}).get("token"):
                    return base64.b64decode(secret["data"]["token"]).decode()
            time.sleep(0.1)
        raise TimeoutError(f"the service account {self.name} got no token")

    def can(self, verb: str, resource: str, namespace: str | None = "", subresource: str = "",
            group: str = "") -> bool:
        """A SelfSubjectAccessReview with this account's token (``namespace`` "" is its own,
        None cluster-wide)."""
        attributes = {"verb": verb, "resource": resource, "subresource": subresource,
                      "group": group}
        namespace = self.namespace if namespace == "" else namespace
        if namespace:
            attributes["namespace"] = namespace
        review = self.api.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes}})
        return review["status"]["allowed"]

    def close_cluster_objects(self):
        for path in self.cluster_objects:
            self.cluster.api.delete(path)


class Account(_Account):
    """The hub's service account in its own namespace, with hub_config/kubernetes-rbac.yaml
    applied."""

    def __init__(self, cluster):
        super().__init__(cluster, cluster.namespace("gpushare"), "hub", "kubernetes-rbac.yaml")

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
        self.close_cluster_objects()
        self.cluster.api.delete(f"/api/v1/namespaces/{self.namespace}")


class AgentAccount(_Account):
    """The node agent's service account beside the hub's (``namespace``), with the RBAC of
    hub_config/kubernetes-agent.yaml; goes with that namespace."""

    def __init__(self, cluster, namespace: str):
        super().__init__(cluster, namespace, "gpushare-agent", "kubernetes-agent.yaml")


def pod_token(cluster, namespace: str, account: str, pod: str, node: str,
              audience: str = "gpushare") -> str:
    """What the kubelet projects into a pod of ``account`` on ``node``: the pod is created
    there, and a token for ``audience`` bound to it asked through the TokenRequest API, as
    the kubelet asks for a serviceAccountToken volume."""
    admin = cluster.api
    created = admin.post(f"/api/v1/namespaces/{namespace}/pods", {
        "metadata": {"name": pod}, "spec": {
            "serviceAccountName": account, "nodeName": node,
            "containers": [{"name": "agent", "image": "x", "command": ["true"]}]}})
    answer = admin.post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", {
        "spec": {"audiences": [audience], "expirationSeconds": 3600, "boundObjectRef": {
            "kind": "Pod", "apiVersion": "v1", "name": pod, "uid": created["metadata"]["uid"]}}})
    return answer["status"]["token"]
