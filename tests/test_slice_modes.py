"""Slicing modes, build profiles and the Kubernetes spawner's pods, without a cluster.

Fragments are compared whole; full pod manifests are validated against the Kubernetes
schema (kubernetes-validate, offline, strict)."""

import asyncio
import os
import subprocess
import sys
import textwrap

import kubernetes_validate
import pytest
from kubernetes_asyncio.config import kube_config
from traitlets import TraitError
from traitlets.config import Config

from jupyter_gpushare.spawner import GPUShareKubeSpawner, LocalGPUShareSpawner
from jupyter_gpushare.spawner import modes, profiles
from jupyter_gpushare.spawner.modes import Fragment
from jupyter_gpushare.spawner.reserve import Held

K8S_VERSION = "1.30"


def caps(fraction: str, percent: str) -> dict:
    return {"GPUSHARE_TORCH_MEMORY_FRACTION": fraction, "TF_FORCE_GPU_ALLOW_GROWTH": "true",
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction,
            "XLA_CLIENT_MEM_FRACTION": fraction, "CUPY_GPU_MEMORY_LIMIT": percent}


def slice_env(mode, gpus, uuid=""):
    return {"GPUSHARE_SLICE_MODE": mode, "GPUSHARE_SLICE_GPUS": gpus, "GPUSHARE_SLICE_UUID": uuid}


BUILD = {"gpushare.io/pool": "build"}
TAINT = {"key": "gpushare.io/build", "operator": "Exists", "effect": "NoSchedule"}


# -- the modes, whole ---------------------------------------------------------------------------

@pytest.mark.parametrize("milli, gpus, percent", [(125, "0.125", "12.5%"), (250, "0.25", "25%"),
                                                 (333, "0.333", "33.3%"), (500, "0.5", "50%")])
def test_timeslice_asks_for_one_shared_replica_and_caps_the_frameworks(milli, gpus, percent):
    assert modes.timeslice(milli) == Fragment(
        env={**slice_env("timeslice", gpus), **caps(gpus, percent)},
        limits={"nvidia.com/gpu.shared": 1})
    assert modes.timeslice(milli, resource="example.com/gpu-replica", node_selector=BUILD,
                           tolerations=[TAINT]) == Fragment(
        env={**slice_env("timeslice", gpus), **caps(gpus, percent)},
        limits={"example.com/gpu-replica": 1}, node_selector=BUILD, tolerations=(TAINT,))


def test_a_whole_gpu_gets_no_framework_caps():
    assert modes.timeslice(1000) == Fragment(env=slice_env("timeslice", "1"),
                                             limits={"nvidia.com/gpu.shared": 1})


MIG_MAP = {125: "nvidia.com/mig-1g.10gb", 250: "nvidia.com/mig-2g.20gb",
           500: "nvidia.com/mig-3g.40gb"}


@pytest.mark.parametrize("milli, gpus", [(125, "0.125"), (250, "0.25"), (500, "0.5")])
def test_mig_asks_for_the_mapped_instance_without_caps(milli, gpus):
    assert modes.mig(milli, profiles=MIG_MAP, node_selector=BUILD) == Fragment(
        env=slice_env("mig", gpus), limits={MIG_MAP[milli]: 1}, node_selector=BUILD)


def test_mig_without_a_profile_for_the_size_says_which_exist():
    with pytest.raises(ValueError) as e:
        modes.mig(333, profiles=MIG_MAP)
    assert str(e.value) == ("no MIG profile is configured for 0.333 GPU (configured: 0.125, "
                            "0.25, 0.5); add one to mig_profiles")


@pytest.mark.parametrize("milli, gpus, percent", [(125, "0.125", 12), (250, "0.25", 25),
                                                 (333, "0.333", 33), (1000, "1", 100)])
def test_hami_asks_for_a_gpu_with_its_memory_and_core_share(milli, gpus, percent):
    assert modes.hami(milli) == Fragment(env=slice_env("hami", gpus), limits={
        "nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": percent,
        "nvidia.com/gpucores": percent})
    assert modes.hami(milli, cores=False) == Fragment(env=slice_env("hami", gpus), limits={
        "nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": percent})


@pytest.mark.parametrize("milli, count", [(1000, 1), (2000, 2), (4000, 4)])
def test_exclusive_gives_whole_gpus(milli, count):
    assert modes.exclusive(milli, tolerations=[TAINT]) == Fragment(
        env=slice_env("exclusive", str(count)), limits={"nvidia.com/gpu": count},
        tolerations=(TAINT,))


def test_exclusive_refuses_a_fraction():
    with pytest.raises(ValueError, match="exclusive mode gives whole GPUs, not 0.5"):
        modes.exclusive(500)


@pytest.mark.parametrize("milli, gpus, percent", [(250, "0.25", "25%"), (500, "0.5", "50%")])
def test_pinned_names_the_gpu_by_uuid_and_caps_the_frameworks(milli, gpus, percent):
    uuid = "GPU-SIMULATED-sim-build-0-0"
    assert modes.pinned(milli, [uuid]) == Fragment(env={
        "CUDA_VISIBLE_DEVICES": uuid, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **slice_env("pinned", gpus, uuid), **caps(gpus, percent)})


def test_pinned_whole_gpus_name_each_and_need_one_uuid_per_gpu():
    assert modes.pinned(2000, ["GPU-a", "GPU-b"]) == Fragment(env={
        "CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b", "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        **slice_env("pinned", "2", "GPU-a,GPU-b")})
    with pytest.raises(ValueError, match="needs 2 GPU UUID"):
        modes.pinned(2000, ["GPU-a"])
    with pytest.raises(ValueError, match="needs 1 GPU UUID"):
        modes.pinned(250, [])


def test_cpu_only_hides_every_gpu_also_in_cuda_images():
    assert modes.cpu_only() == Fragment(env={
        "NVIDIA_VISIBLE_DEVICES": "void", "CUDA_VISIBLE_DEVICES": "", **slice_env("cpu", "0")})


def test_fragments_add_up_with_the_later_one_winning():
    a = Fragment(env={"A": "1", "B": "1"}, limits={"x/y": 1}, node_selector={"n": "1"},
                 tolerations=(TAINT,), annotations={"a": "1"})
    b = Fragment(env={"B": "2"}, node_selector={"m": "2"}, tolerations=(TAINT, {"key": "k"}))
    assert a + b == Fragment(env={"A": "1", "B": "2"}, limits={"x/y": 1},
                             node_selector={"n": "1", "m": "2"},
                             tolerations=(TAINT, {"key": "k"}), annotations={"a": "1"})
    assert modes.on_node("gpu-7") == Fragment(node_selector={"kubernetes.io/hostname": "gpu-7"})


# -- build profiles ---------------------------------------------------------------------------

def parse(entries, mode="timeslice", modes_=("timeslice", "mig", "hami", "exclusive")):
    return profiles.parse(entries, owner="X.build_profiles", mode=mode, modes=modes_)


def test_profiles_get_names_slugs_and_descriptions_from_their_size():
    found = parse([{"gpus": 0.25, "default": True}, {"gpus": 0.5, "groups": ["vision"]},
                   {"gpus": 0}, {"gpus": 2, "mode": "exclusive"}, {"gpus": 0.3}])
    assert [(p.slug, p.display_name, p.milli, p.mode, p.groups, p.default) for p in found] == [
        ("quarter-gpu", "¼ GPU", 250, "timeslice", frozenset(), True),
        ("half-gpu", "½ GPU", 500, "timeslice", frozenset({"vision"}), False),
        ("cpu", "CPU only", 0, "cpu", frozenset(), False),
        ("2-gpus", "2 GPUs", 2000, "exclusive", frozenset(), False),
        ("gpu-300m", "0.3 GPU", 300, "timeslice", frozenset(), False)]
    assert found[0].description == ("0.25 of one GPU, yours while the server runs: for "
                                    "building and debugging; train with %%train.")
    assert found[2].description == "No GPU. Send GPU work to the train pool with %%train."


def test_groups_restrict_who_sees_and_who_may_start_a_profile():
    found = parse([{"gpus": 0.25}, {"gpus": 0.5, "groups": ["vision"], "default": True},
                   {"gpus": 1, "mode": "exclusive", "groups": ["admins", "vision"]}])
    assert [p.slug for p in profiles.visible_to(found, [])] == ["quarter-gpu"]
    assert [p.slug for p in profiles.visible_to(found, ["nlp", "vision"])] == \
        ["quarter-gpu", "half-gpu", "1-gpu"]
    # The default is the first one the user may have when the marked one is not theirs.
    assert profiles.choose(found, None, ["vision"]).slug == "half-gpu"
    assert profiles.choose(found, "", []).slug == "quarter-gpu"
    assert profiles.choose(found, "1-gpu", ["admins"]).slug == "1-gpu"
    with pytest.raises(ValueError) as e:
        profiles.choose(found, "half-gpu", ["nlp"])  # e.g. sent through the REST API
    assert str(e.value) == "There is no build profile 'half-gpu' for you; choose one of quarter-gpu."
    with pytest.raises(ValueError) as e:
        profiles.choose(parse([{"gpus": 0.5, "groups": ["vision"]}]), None, ["nlp"])
    assert str(e.value) == ("No build profile is open to you; ask an administrator to add you "
                            "to the group of one.")


def test_kube_profile_list_and_the_local_form_show_what_the_user_may_pick():
    found = parse([{"gpus": 0.25, "default": True},
                   {"gpus": 0.5, "groups": ["vision"], "display_name": "Half <b>GPU</b>",
                    "kubespawner_override": {"image": "example.org/cuda-notebook:1"}},
                   {"gpus": 0}])
    mine = profiles.visible_to(found, ["vision"])
    assert profiles.kube_profile_list(mine) == [
        {"display_name": "¼ GPU", "slug": "quarter-gpu", "description": found[0].description,
         "default": True, "kubespawner_override": {}},
        {"display_name": "Half <b>GPU</b>", "slug": "half-gpu",
         "description": found[1].description, "default": False,
         "kubespawner_override": {"image": "example.org/cuda-notebook:1"}},
        {"display_name": "CPU only", "slug": "cpu", "description": found[2].description,
         "default": False, "kubespawner_override": {}}]
    form = profiles.options_form(profiles.visible_to(found, []), selected="cpu")
    assert form.count('type="radio"') == 2 and "half-gpu" not in form
    assert 'value="cpu" checked' in form and 'value="quarter-gpu">' in form
    assert "Half &lt;b&gt;" in profiles.options_form(mine)  # names are escaped
    odd = parse([{"gpus": 0.25, "description": "{{ not a template }}"}, {"gpus": 0}])
    assert "&#123;&#123; not a template &#125;&#125;" in profiles.options_form(odd)
    assert profiles.options_from_form({"profile": ["cpu"]}) == {"profile": "cpu"}
    assert profiles.options_from_form({}) == {"profile": ""}


@pytest.mark.parametrize("entries, message", [
    ([], "X.build_profiles must be a non-empty list of profiles like {\"gpus\": 0.25}"),
    ([{"gpus": 1.5}], "X.build_profiles[0]['gpus'] must be 0 (CPU only), a fraction of one GPU "
                      "up to 1, or a whole number of GPUs, not 1.5"),
    ([{"gpus": -1}], "X.build_profiles[0]['gpus'] must be 0 (CPU only), a fraction of one GPU "
                     "up to 1, or a whole number of GPUs, not -1"),
    ([{"gpus": "0.5"}], "X.build_profiles[0]['gpus'] must be 0 (CPU only), a fraction of one "
                        "GPU up to 1, or a whole number of GPUs, not '0.5'"),
    ([{"gpus": 0.25}, {"gpu": 0.5}], "X.build_profiles[1] has unknown key(s) gpu; the keys are "
                                     "default, description, display_name, gpus, groups, "
                                     "kubespawner_override, mode, slug"),
    ([{"gpus": 2}], "X.build_profiles[0] asks for 2 GPUs: more than one GPU is given whole, so "
                    "add \"mode\": \"exclusive\""),
    ([{"gpus": 0.5, "mode": "exclusive"}], "X.build_profiles[0] asks for 0.5 GPU in exclusive "
                                           "mode, which gives whole GPUs; use another mode for "
                                           "a fraction"),
    ([{"gpus": 0.5, "mode": "pinned"}], "X.build_profiles[0]['mode'] must be one of exclusive, "
                                        "hami, mig, timeslice, not 'pinned'"),
    ([{"gpus": 0.5, "groups": "vision"}], "X.build_profiles[0]['groups'] must be a list of "
                                          "JupyterHub group names"),
    ([{"gpus": 0.5, "slug": "Half GPU"}], "X.build_profiles[0]['slug'] must be lower-case "
                                          "letters, digits and '-' (at most 63), not 'Half GPU'"),
    ([{"gpus": 0.5}, {"gpus": 0.25, "slug": "half-gpu"}],
     "X.build_profiles has two profiles with the slug 'half-gpu'; give one of them another "
     "\"slug\""),
    ([{"gpus": 0.5, "default": True}, {"gpus": 0, "default": True}],
     "X.build_profiles marks more than one profile \"default\": true; keep one"),
    ([{"gpus": 0.0001}], "X.build_profiles[0]['gpus'] is 0.0001, less than the smallest slice "
                         "(0.001 GPU); use 0 for CPU only"),
])
def test_a_bad_profile_is_one_sentence(entries, message):
    with pytest.raises(ValueError) as e:
        parse(entries)
    assert str(e.value) == message


def test_bad_slice_configuration_is_refused_when_the_spawner_is_configured():
    def configured(cls, **options):
        return cls(config=Config({cls.__name__: options}))

    for cls, options, message in [
        (LocalGPUShareSpawner, {"build_profiles": [{"gpus": 1.5}]},
         "LocalGPUShareSpawner.build_profiles[0]['gpus'] must be 0 (CPU only), a fraction of "
         "one GPU up to 1, or a whole number of GPUs, not 1.5"),
        (LocalGPUShareSpawner, {"slice_mode": "timeslice"},
         "LocalGPUShareSpawner.slice_mode must be one of pinned, not 'timeslice'"),
        (GPUShareKubeSpawner, {"slice_mode": "mig", "build_profiles": [{"gpus": 0.3}]},
         "no MIG profile is configured for 0.3 GPU (configured: 0.125, 0.25, 0.5, 1); add one "
         "to mig_profiles"),
        (GPUShareKubeSpawner, {"mig_profiles": {1.5: "nvidia.com/mig-7g.80gb"}},
         "GPUShareKubeSpawner.mig_profiles keys must be fractions of a GPU (more than 0, at "
         "most 1), not 1.5"),
        (GPUShareKubeSpawner, {"mig_profiles": {0.5: "mig 3g"}},
         "GPUShareKubeSpawner.mig_profiles[0.5] must be a resource name like "
         "'nvidia.com/mig-1g.10gb', not 'mig 3g'"),
    ]:
        with pytest.raises(TraitError) as e:
            if cls is GPUShareKubeSpawner:  # made in a running loop, as in the hub
                asyncio.run(_in_loop(lambda: cls(_mock=True, user=Member("alice"),
                                                 config=Config({cls.__name__: options}))))
            else:
                configured(cls, **options)
        assert str(e.value) == message and "\n" not in str(e.value)


# -- the Kubernetes spawner's pods --------------------------------------------------------------

class Member:
    """The little of a JupyterHub user that a pod manifest reads."""

    def __init__(self, name, groups=()):
        self.name = self.escaped_name = name
        self.id = 7
        self.url = f"/user/{name}/"
        self.groups = [type("Group", (), {"name": g})() for g in groups]
        self.settings = {}


async def _in_loop(make):
    return make()


@pytest.fixture(autouse=True)
def kubeconfig(tmp_path, monkeypatch):
    # KubeSpawner loads a kubeconfig when it is made, even when it never talks to a cluster.
    path = tmp_path / "kubeconfig"
    path.write_text(textwrap.dedent("""\
        apiVersion: v1
        kind: Config
        clusters: [{name: none, cluster: {server: "https://127.0.0.1:9"}}]
        users: [{name: none, user: {token: unused}}]
        contexts: [{name: none, context: {cluster: none, user: none}}]
        current-context: none
        """))
    monkeypatch.setenv("KUBECONFIG", str(path))
    # kubernetes_asyncio reads $KUBECONFIG once, when it is imported.
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))


def pod_for(options=None, held=(), groups=(), profile=None, spawner=None):
    """A full pod manifest as a dict, from a real GPUShareKubeSpawner (no cluster)."""
    from kubernetes_asyncio.client import ApiClient

    async def build():
        s = spawner or GPUShareKubeSpawner(
            _mock=True, user=Member("alice", groups),
            config=Config({"GPUShareKubeSpawner": {
                "gpushare_url": "http://proxy-public/services/gpushare/",
                "build_node_selector": BUILD, "build_tolerations": [TAINT], **(options or {})}}))
        s.user_options = {"profile": profile} if profile else {}
        s._slices = list(held)
        pod = await s.get_pod_manifest()
        await s.api.api_client.close()  # KubeSpawner's client, never used here
        return ApiClient().sanitize_for_serialization(pod), s
    return asyncio.run(build())


def container_env(manifest) -> dict:
    return {e["name"]: e.get("value") for e in manifest["spec"]["containers"][0]["env"]}


PROFILES = [{"gpus": 0.125}, {"gpus": 0.25, "default": True}, {"gpus": 0.5}, {"gpus": 1},
            {"gpus": 0}]


@pytest.mark.parametrize("mode, gpus", [
    (mode, gpus) for mode in ("timeslice", "mig", "hami", "exclusive")
    for gpus in (0.125, 0.25, 0.5, 1, 0) if mode != "exclusive" or gpus in (0, 1)])
def test_every_mode_and_size_builds_a_valid_pod(mode, gpus):
    entries = [p for p in PROFILES if mode != "exclusive" or p["gpus"] in (0, 1)]
    slug = profiles.default_slug(round(gpus * 1000))
    held = [Held("s-1", round(gpus * 1000), "gpu-node-3", 0, None)] if gpus else []
    manifest, spawner = pod_for({"slice_mode": mode, "build_profiles": entries}, held=held,
                                profile=slug)
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True) == K8S_VERSION
    fragment = spawner.current_fragment()
    container = manifest["spec"]["containers"][0]
    env = container_env(manifest)
    assert {k: env[k] for k in fragment.env} == fragment.env
    assert env["GPUSHARE_URL"] == "http://proxy-public/services/gpushare/"
    assert env["PYTHONSTARTUP"] == "/etc/gpushare/pythonstartup.py"
    startup = {"name": "gpushare-startup", "mountPath": "/etc/gpushare", "readOnly": True}
    assert startup in container["volumeMounts"]
    assert {"name": "gpushare-startup", "downwardAPI": {"items": [{
        "path": "pythonstartup.py", "fieldRef": {
            "fieldPath": "metadata.annotations['gpushare.io/pythonstartup']"}}]}} in \
        manifest["spec"]["volumes"]
    assert "jupyter_gpushare.spawner.kernel" in \
        manifest["metadata"]["annotations"]["gpushare.io/pythonstartup"]
    if not gpus:
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
        assert not container["resources"].get("limits")
        assert "nodeSelector" not in manifest["spec"]
        return
    assert container["resources"]["limits"] == {
        "timeslice": {"nvidia.com/gpu.shared": 1},
        "mig": {"nvidia.com/mig-1g.10gb": 1} if gpus == 0.125 else
               {"nvidia.com/mig-2g.20gb": 1} if gpus == 0.25 else
               {"nvidia.com/mig-3g.40gb": 1} if gpus == 0.5 else {"nvidia.com/mig-7g.80gb": 1},
        "hami": {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": round(gpus * 100),
                 "nvidia.com/gpucores": round(gpus * 100)},
        "exclusive": {"nvidia.com/gpu": 1},
    }[mode]
    assert manifest["spec"]["nodeSelector"] == {**BUILD, "kubernetes.io/hostname": "gpu-node-3"}
    assert manifest["spec"]["tolerations"] == [TAINT]
    # the node agent finds the slice of the pod's GPU use by this annotation
    assert manifest["metadata"]["annotations"]["gpushare.jupyter.org/slices"] == "s-1"


def test_the_pod_is_built_without_a_reservation_for_the_default_profile():
    manifest, _ = pod_for()
    assert kubernetes_validate.validate(manifest, K8S_VERSION, strict=True) == K8S_VERSION
    container = manifest["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu.shared": 1}
    assert manifest["spec"]["nodeSelector"] == BUILD  # no slice yet: any build node
    assert container_env(manifest)["GPUSHARE_SLICE_GPUS"] == "0.25"
    assert "gpushare.jupyter.org/slices" not in manifest["metadata"]["annotations"]


def test_nothing_of_one_spawn_sticks_to_the_next():
    options = {"node_selector": {"disk": "ssd"}, "extra_resource_limits": {"example.com/fpga": "1"}}
    half, spawner = pod_for(options, held=[Held("s-1", 500, "gpu-node-1", 0, None)],
                            profile="half-gpu")
    assert half["spec"]["nodeSelector"] == {"disk": "ssd", **BUILD,
                                            "kubernetes.io/hostname": "gpu-node-1"}
    assert half["spec"]["containers"][0]["resources"]["limits"] == {
        "example.com/fpga": "1", "nvidia.com/gpu.shared": 1}
    # The same spawner's next start chooses CPU only: no GPU, no node pin, config unchanged.
    cpu, _ = pod_for(profile="cpu", spawner=spawner)
    assert cpu["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert cpu["spec"]["containers"][0]["resources"]["limits"] == {"example.com/fpga": "1"}
    assert spawner.node_selector == {"disk": "ssd"}
    assert spawner.extra_resource_limits == {"example.com/fpga": "1"}
    assert "tolerations" not in cpu["spec"]


def test_the_kube_profile_list_follows_the_users_groups():
    entries = [{"gpus": 0.25}, {"gpus": 0.5, "groups": ["vision"]}, {"gpus": 0}]

    async def lists():
        out = {}
        for name, groups in [("alice", ["vision"]), ("bob", ["nlp"])]:
            s = GPUShareKubeSpawner(_mock=True, user=Member(name, groups), config=Config(
                {"GPUShareKubeSpawner": {"build_profiles": entries}}))
            out[name] = [p["slug"] for p in s.profile_list(s)]
            form = await s.options_form(s)
            out[name + "-form"] = ("half-gpu" in form, "quarter-gpu" in form)
        return out

    assert asyncio.run(lists()) == {"alice": ["quarter-gpu", "half-gpu", "cpu"],
                                    "bob": ["quarter-gpu", "cpu"],
                                    "alice-form": (True, True), "bob-form": (False, True)}


def test_a_profile_the_user_may_not_have_is_refused_before_anything_starts():
    from jupyterhub.spawner import SpawnException

    async def start():
        s = GPUShareKubeSpawner(_mock=True, user=Member("bob", ["nlp"]), config=Config(
            {"GPUShareKubeSpawner": {"build_profiles": [{"gpus": 0.25},
                                                        {"gpus": 0.5, "groups": ["vision"]}]}}))
        s.user_options = {"profile": "half-gpu"}
        await s.start()

    with pytest.raises(SpawnException) as e:
        asyncio.run(start())
    assert e.value.message == ("There is no build profile 'half-gpu' for you; choose one of "
                               "quarter-gpu.")


# -- in the kernel ----------------------------------------------------------------------------

STAND_IN_TORCH = '''
"""A stand-in for torch (not installed here, and no GPU): it records what is asked of it.
CUDA starts on _init(), running the queued calls like torch.cuda._lazy_init does."""
'''
STAND_IN_CUDA = '''
calls, queued, started = [], [], False
def device_count(): return 2
def is_initialized(): return started
def _lazy_call(fn): queued.append(fn)
def set_per_process_memory_fraction(fraction, device=None): calls.append((fraction, device))
def _init():
    global started
    started = True
    for fn in queued: fn()
'''


def test_pytorch_is_capped_when_imported_and_cuda_starts(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(STAND_IN_TORCH + "from . import cuda\n")
    (tmp_path / "torch" / "cuda.py").write_text(STAND_IN_CUDA)
    code = textwrap.dedent("""
        import sys
        from jupyter_gpushare.spawner import kernel
        kernel.start()
        assert "torch" not in sys.modules  # nothing imported early
        import torch
        print("before CUDA", torch.cuda.calls)
        torch.cuda._init()
        print("after CUDA", torch.cuda.calls)
        print("loader", type(torch.__spec__.loader).__name__)
        print("hooks left", sum(type(f).__name__ == "_AfterImport" for f in sys.meta_path))
        """)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "GPUSHARE_TORCH_MEMORY_FRACTION": "0.25"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["before CUDA []", "after CUDA [(0.25, 0), (0.25, 1)]",
                                        "loader SourceFileLoader", "hooks left 0"]
    assert done.stderr == ""


def test_a_bad_fraction_is_one_line_and_the_kernel_goes_on():
    env = {**os.environ, "GPUSHARE_TORCH_MEMORY_FRACTION": "a lot"}
    done = subprocess.run([sys.executable, "-c", "from jupyter_gpushare.spawner import kernel; "
                           "kernel.start(); print('ok')"], env=env, capture_output=True,
                          text=True)
    assert done.stdout == "ok\n"
    assert done.stderr == ("gpushare: GPUSHARE_TORCH_MEMORY_FRACTION='a lot' is not a number; "
                           "PyTorch is not capped\n")


GPU_CHECK = """
import torch
total = torch.cuda.get_device_properties(0).total_memory
ok = torch.empty(int(total * 0.20), dtype=torch.uint8, device="cuda")
del ok
torch.cuda.empty_cache()
try:
    torch.empty(int(total * 0.35), dtype=torch.uint8, device="cuda")
    print("0.35 allocated")
except torch.cuda.OutOfMemoryError:
    print("0.35 refused")
"""


def test_on_a_gpu_a_quarter_slice_refuses_more_than_a_quarter():
    """Runs where torch and a CUDA GPU are: a ¼ slice's caps let 20 % of the memory be
    allocated and refuse 35 %."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here")
    env = {**os.environ, **modes.framework_caps(250)}
    code = "from jupyter_gpushare.spawner import kernel; kernel.start()\n" + GPU_CHECK
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0.35 refused"


# -- refusals before anything starts ------------------------------------------------------------

@pytest.mark.parametrize("options, message, reason", [
    ({"pool_url": "http://127.0.0.1:9/services/gpushare/", "pool_api_token": "t0ken"},
     "The GPU pool service is not answering, so no build slice can be reserved; try again in "
     "a minute, or choose CPU only.", "build_pool_down"),
    ({"pool_url": "http://127.0.0.1:9/services/gpushare/"},
     "The hub could not reserve a build slice because of its configuration; please tell an "
     "administrator.", "build_slice_config"),
])
def test_a_pool_that_cannot_be_asked_is_one_sentence_for_the_user(options, message, reason,
                                                                   monkeypatch):
    from jupyterhub.spawner import SpawnException
    monkeypatch.delenv("GPUSHARE_SPAWNER_TOKEN", raising=False)
    spawner = LocalGPUShareSpawner(user=Member("alice"), **options)
    with pytest.raises(SpawnException) as e:
        asyncio.run(spawner.start())
    assert (e.value.message, e.value.reason, e.value.jupyterhub_message) == \
        (message, reason, message)
    assert "t0ken" not in e.value.log_message
