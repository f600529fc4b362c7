"""The zero-to-jupyterhub deployment in hub_config/: every Kubernetes object (RBAC, network
policies, the node agent's DaemonSet, the values' policy rules and ports) valid against
Kubernetes' schemas and accepted by the real API server (dry run); the values' JupyterHub,
spawner, pool service and node agent options real traits that load; the pieces that must
agree (port, service names, scopes, tokens, device-plugin resource) agreeing; the node agent's
rights checked with access reviews. The hub's RBAC is exercised in test_backend_kube.py, the
agent's in test_agent_kube.py."""

import kubernetes_validate
import pytest
import yaml
from traitlets.config import Config

from jupyter_gpushare.agent.app import NodeAgent
from jupyter_gpushare.backends.kube import KubernetesBackend
from jupyter_gpushare.pool.app import PoolService
from jupyter_gpushare.pool.utilization.service import GPUUsage
from jupyter_gpushare.spawner import GPUShareKubeSpawner
from kube_account import HUB_CONFIG, AgentAccount

VALUES = yaml.safe_load((HUB_CONFIG / "z2jh-values.yaml").read_text())
PORT = 10101


def load(name):
    return list(yaml.safe_load_all((HUB_CONFIG / name).read_text()))


def policy(name, selector, *, ingress=None, egress=None):
    spec = {"podSelector": {"matchLabels": selector}, "policyTypes": []}
    if ingress is not None:
        spec["policyTypes"].append("Ingress")
        spec["ingress"] = ingress
    if egress is not None:
        spec["policyTypes"].append("Egress")
        spec["egress"] = egress
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name}, "spec": spec}


def objects():
    """Every object we ship, and the values' rules and ports as the chart would render them."""
    hub, proxy, user = VALUES["hub"], VALUES["proxy"], VALUES["singleuser"]
    rendered = [
        policy("hub", {"component": "hub"}, ingress=hub["networkPolicy"]["ingress"]),
        policy("proxy", {"component": "proxy"}, egress=proxy["chp"]["networkPolicy"]["egress"]),
        policy("singleuser", {"component": "singleuser-server"},
               egress=user["networkPolicy"]["egress"]),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "hub"},
         "spec": {"selector": {"component": "hub"},
                  "ports": [{"name": "hub", "port": 8081}, *hub["service"]["extraPorts"]]}},
    ]
    return (load("kubernetes-rbac.yaml") + load("kubernetes-netpol.yaml")
            + load("kubernetes-agent.yaml") + rendered)


@pytest.mark.parametrize("obj", objects(), ids=lambda o: f"{o['kind']}-{o['metadata']['name']}")
def test_objects_are_valid(obj):
    kubernetes_validate.validate(obj, "1.25.0", strict=True)


def test_the_service_is_reachable_where_the_values_say():
    hub = VALUES["hub"]
    service = hub["services"]["gpushare"]
    assert service["url"] == f"http://hub:{PORT}"
    assert "--PoolService.ip=0.0.0.0" in service["command"]
    assert [p["port"] for p in hub["service"]["extraPorts"]] == [PORT]
    assert hub["networkPolicy"]["ingress"][0]["ports"][0]["port"] == PORT
    assert VALUES["proxy"]["chp"]["networkPolicy"]["egress"][0]["ports"][0]["port"] == PORT
    spawner = hub["config"]["GPUShareKubeSpawner"]
    assert spawner["gpushare_url"] == "http://proxy-public/services/gpushare/"
    roles = hub["loadRoles"]
    assert "access:services!service=gpushare" in roles["user"]["scopes"]
    assert roles["gpushare-spawner"]["services"] == ["gpushare-spawner"]
    assert roles["gpushare-agent"] == {"services": ["gpushare-agent"],
                                       "scopes": ["access:services!service=gpushare"]}
    assert set(hub["services"]) == {"gpushare", "gpushare-spawner", "gpushare-agent"}
    assert hub["config"]["JupyterHub"]["spawner_class"] == "gpushare-kubernetes"


def test_the_dashboard_is_an_oauth_client_of_the_hub():
    """Browsers log in to /services/gpushare/dashboard through the hub: the service entry's
    OAuth keys are JupyterHub's own, and pool admins' scope is one the hub knows."""
    from jupyterhub.services.service import Service
    hub = VALUES["hub"]
    service = hub["services"]["gpushare"]
    assert not set(service) - set(Service.class_trait_names(input=True))
    assert service["oauth_redirect_uri"] == "/services/gpushare/oauth_callback"
    assert service["oauth_no_confirm"] is True
    assert service["oauth_client_allowed_scopes"] == ["custom:gpushare:admin"]
    assert "custom:gpushare:admin" in hub["config"]["JupyterHub"]["custom_scopes"]


def test_every_option_in_the_values_is_a_real_trait(tmp_path):
    spawner = VALUES["hub"]["config"]["GPUShareKubeSpawner"]
    unknown = set(spawner) - set(GPUShareKubeSpawner.class_trait_names(config=True))
    assert not unknown
    # The pool service's file, loaded as the service loads it.
    path = tmp_path / "gpushare_config.py"
    path.write_text(VALUES["hub"]["extraFiles"]["gpushare-config"]["stringData"])
    service = PoolService()
    service.load_config_file(str(path))
    config: Config = service.config
    for section, cls in (("PoolService", PoolService), ("KubernetesBackend", KubernetesBackend),
                         ("GPUUsage", GPUUsage)):
        assert not set(config[section]) - set(cls.class_trait_names(config=True)), section
    service.update_config(config)
    assert service.backend_class is KubernetesBackend
    backend = KubernetesBackend(config=config)
    assert backend.train_node_selector == {"gpushare.jupyter.org/pool": "train"}
    assert spawner["build_node_selector"] == {"gpushare.jupyter.org/pool": "build"}


def test_the_node_agent_runs_on_every_gpu_node_with_the_agent_services_token():
    (daemonset,) = [o for o in load("kubernetes-agent.yaml") if o["kind"] == "DaemonSet"]
    (binding,) = [o for o in load("kubernetes-agent.yaml") if o["kind"] == "RoleBinding"]
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["hostPID"] is True  # the pids NVML reports, and their cgroups
    assert pod["serviceAccountName"] == binding["subjects"][0]["name"] == "gpushare-agent"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "gpushare.jupyter.org/pool", "operator": "In",
                                         "values": ["train", "build"]}]
    spawner = VALUES["hub"]["config"]["GPUShareKubeSpawner"]
    assert spawner["build_node_selector"] == {"gpushare.jupyter.org/pool": "build"}
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    # the token the chart generates for the service the pool accepts readings from
    service = VALUES["hub"]["services"]["gpushare-agent"]
    assert service == {} and GPUUsage.agent_service.default_value == "gpushare-agent"
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "hub", "key": "hub.services.gpushare-agent.apiToken"}
    assert env["GPUSHARE_URL"]["value"] == spawner["gpushare_url"]
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # its arguments are real options; its sampling interval is the pool's
    assert container["command"] == ["python3", "-m", "jupyter_gpushare.agent"]
    agent = NodeAgent()
    agent.parse_command_line(container["args"])
    assert not set(agent.config["NodeAgent"]) - set(NodeAgent.class_trait_names(config=True))
    agent.update_config(agent.config)
    assert agent.sample_interval == GPUUsage.sample_interval.default_value
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert agent.pod_resources_socket.startswith(
        mounts["/var/lib/kubelet/pod-resources"]["mountPath"] + "/")
    # its pod's own token, for the audience the pool reviews it for: where the agent reads it
    from jupyter_gpushare.pool.utilization.node_agents import AUDIENCE
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in container["volumeMounts"]
                 if agent.node_token_file.startswith(m["mountPath"] + "/"))
    (source,) = volumes[mount["name"]]["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == AUDIENCE
    assert agent.node_token_file == f"{mount['mountPath']}/{source['serviceAccountToken']['path']}"
    security = container["securityContext"]
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["allowPrivilegeEscalation"] is False


def test_the_device_plugin_advertises_what_the_spawner_and_backend_ask_for():
    values = yaml.safe_load((HUB_CONFIG / "nvidia-device-plugin-values.yaml").read_text())
    configs = {name: yaml.safe_load(text) for name, text in values["config"]["map"].items()}
    assert values["config"]["default"] == "train"
    assert all(c["version"] == "v1" for c in configs.values())
    sliced = configs["build-timeslice"]["sharing"]["timeSlicing"]
    # renamed replicas are nvidia.com/gpu.shared: what timeslice slices ask for
    assert sliced["renameByDefault"] is True
    assert GPUShareKubeSpawner.timeslice_resource.default_value == "nvidia.com/gpu.shared"
    assert sliced["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert configs["build-mig"]["flags"]["migStrategy"] == "mixed"
    assert "sharing" not in configs["train"]  # whole GPUs, as the backend requests them
    assert KubernetesBackend.gpu_resource.default_value == "nvidia.com/gpu"


@pytest.mark.kube
def test_the_api_server_accepts_the_objects(kube):
    for obj in objects():
        kind = obj["kind"]
        if kind.startswith("Cluster"):
            path = f"/apis/rbac.authorization.k8s.io/v1/{kind.lower()}s"
        elif kind in ("Role", "RoleBinding"):
            path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{kube.namespace}/{kind.lower()}s"
        elif kind == "NetworkPolicy":
            path = f"/apis/networking.k8s.io/v1/namespaces/{kube.namespace}/networkpolicies"
        elif kind == "DaemonSet":
            path = f"/apis/apps/v1/namespaces/{kube.namespace}/daemonsets"
        else:
            path = f"/api/v1/namespaces/{kube.namespace}/{kind.lower()}s"
        created = kube.api.request("POST", path, obj, query={"dryRun": "All"})
        assert created["kind"] == kind


@pytest.mark.kube
def test_the_node_agent_may_list_pods_of_its_namespace_and_nothing_more(kube, kube_cluster):
    agent = AgentAccount(kube_cluster, kube.namespace)
    assert agent.can("list", "pods")
    denied = [("get", "pods"), ("watch", "pods"), ("create", "pods"), ("delete", "pods"),
              ("patch", "pods"), ("list", "pods", "default"), ("list", "pods", None),
              ("get", "pods", "", "log"), ("create", "pods", "", "exec"),
              ("get", "secrets"), ("list", "secrets"), ("list", "configmaps"),
              ("list", "nodes", None), ("get", "nodes", None, "proxy"),
              ("create", "serviceaccounts", "", "token"), ("list", "events")]
    assert [d for d in denied if agent.can(*d)] == []
