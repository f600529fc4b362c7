"""``GPUShareKubeSpawner``: KubeSpawner with build slices.

``get_pod_manifest()`` builds the notebook pod for the chosen (or default) build profile
without asking the pool service: KubeSpawner's pod plus the slicing mode's fragment (GPU
resources, node selector, tolerations) and the kernel start-up file. ``start()`` reserves the
slice first (``base.py``), so the pod it creates is also kept on the node the pool packed the
slice on. The GPU resources are added to each pod as it is built, never through profile
overrides or class-level dicts, so nothing of one spawn sticks to the next.
"""

from __future__ import annotations

import re
from pathlib import Path

from kubernetes_asyncio.client.models import (V1DownwardAPIVolumeFile,
                                              V1DownwardAPIVolumeSource,
                                              V1ObjectFieldSelector, V1ResourceRequirements,
                                              V1Toleration, V1Volume, V1VolumeMount)
from kubespawner import KubeSpawner
from kubespawner.utils import get_k8s_model
from traitlets import Bool, Dict, List, TraitError, Unicode, default, validate

from ..backends.kube.objects import SLICES
from ..policy.model import GPU
from . import profiles as build_profiles
from .base import GPUShareSpawnerBase
from .modes import (EXCLUSIVE, HAMI, MIG, TIMESLICE, Fragment, cpu_only, exclusive, hami, mig,
                    on_node, timeslice)

STARTUP_ANNOTATION = "gpushare.io/pythonstartup"
STARTUP_VOLUME = "gpushare-startup"
_RESOURCE = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?\Z")


class GPUShareKubeSpawner(GPUShareSpawnerBase, KubeSpawner):
    """Notebook pods on the build pool, each with its slice of a GPU."""

    slice_modes = (TIMESLICE, MIG, HAMI, EXCLUSIVE)

    timeslice_resource = Unicode("nvidia.com/gpu.shared", help="""
        Extended resource of one time-sliced GPU replica: what the NVIDIA device plugin
        advertises with time-slicing and renameByDefault (slice_mode "timeslice").
        """).tag(config=True)

    gpu_resource = Unicode("nvidia.com/gpu", help="""
        Extended resource of a whole GPU (slice_mode "exclusive").
        """).tag(config=True)

    mig_profiles = Dict({0.125: "nvidia.com/mig-1g.10gb", 0.25: "nvidia.com/mig-2g.20gb",
                         0.5: "nvidia.com/mig-3g.40gb", 1: "nvidia.com/mig-7g.80gb"}, help="""
        For slice_mode "mig": the MIG resource (device plugin, mixed strategy) of each slice
        size, as {fraction of the GPU: resource}. The default is an 80 GB H100's profiles by
        their share of memory (1g.10gb is 1/8 of the memory and 1/7 of the compute). Every
        build profile's size must be here.
        """).tag(config=True)

    hami_cores = Bool(True, help="""
        For slice_mode "hami": also limit the compute share (nvidia.com/gpucores) to the
        slice, not only the memory (nvidia.com/gpumem-percentage).
        """).tag(config=True)

    build_node_selector = Dict(help="""
        Node labels of the build pool's GPU nodes, added to the pod's node selector of every
        GPU build profile (not of CPU-only ones), e.g. {"gpushare.jupyter.org/pool": "build"}.
        """).tag(config=True)

    build_tolerations = List(Dict(), help="""
        Tolerations added to pods of GPU build profiles, e.g. for a taint that keeps other
        pods off the build pool: [{"key": "nvidia.com/gpu", "operator": "Exists",
        "effect": "NoSchedule"}].
        """).tag(config=True)

    pin_to_slice_node = Bool(True, help="""
        Keep a pod on the node its slice was reserved on (kubernetes.io/hostname), so that
        the pool's packing and the cluster agree; PoolService.build_nodes then names
        Kubernetes nodes.
        """).tag(config=True)

    kernel_startup_dir = Unicode("/etc/gpushare", help="""
        Where the kernel start-up file is mounted in the notebook container (from the pod's
        own annotation, through the downward API: nothing to install in the image but
        jupyter-gpushare).
        """).tag(config=True)

    @default("profile_list")
    def _default_profile_list(self):
        def profile_list(spawner):
            return build_profiles.kube_profile_list(spawner.visible_profiles())
        return profile_list

    @validate("mig_profiles")
    def _check_mig_profiles(self, proposal):
        self._mig_map(proposal.value)
        return proposal.value

    def _mig_map(self, value=None) -> dict[int, str]:
        value = self.mig_profiles if value is None else value
        out = {}
        for fraction, resource in value.items():
            try:
                milli = round(float(fraction) * GPU)
            except (TypeError, ValueError):
                milli = -1
            if not 0 < milli <= GPU:
                raise TraitError(f"{type(self).__name__}.mig_profiles keys must be fractions "
                                 f"of a GPU (more than 0, at most 1), not {fraction!r}")
            if not isinstance(resource, str) or not _RESOURCE.match(resource):
                raise TraitError(f"{type(self).__name__}.mig_profiles[{fraction!r}] must be "
                                 f"a resource name like 'nvidia.com/mig-1g.10gb', not "
                                 f"{resource!r}")
            out[milli] = resource
        return out

    def check_profile(self, profile):
        if profile.mode == MIG:
            mig(profile.milli, profiles=self._mig_map())  # ValueError if the size is missing

    def slice_fragment(self, profile, held) -> Fragment:
        if not profile.milli:
            fragment = cpu_only()
        else:
            where = {"node_selector": self.build_node_selector,
                     "tolerations": self.build_tolerations}
            if profile.mode == TIMESLICE:
                fragment = timeslice(profile.milli, resource=self.timeslice_resource, **where)
            elif profile.mode == MIG:
                fragment = mig(profile.milli, profiles=self._mig_map(), **where)
            elif profile.mode == HAMI:
                fragment = hami(profile.milli, cores=self.hami_cores, **where)
            else:
                fragment = exclusive(profile.milli, resource=self.gpu_resource, **where)
            nodes = {h.node for h in held}
            if self.pin_to_slice_node and len(nodes) == 1:
                fragment += on_node(nodes.pop())
            if held:  # the node agent attributes the pod's GPU use to these slices
                fragment += Fragment(annotations={SLICES: ",".join(h.id for h in held)})
        if self.kernel_startup:
            fragment += Fragment(annotations={STARTUP_ANNOTATION: _startup_source()})
        return fragment

    def kernel_startup_path(self) -> str:
        return f"{self.kernel_startup_dir.rstrip('/')}/pythonstartup.py"

    async def get_pod_manifest(self):
        pod = await super().get_pod_manifest()
        return add_fragment(pod, self.current_fragment(),
                            self.kernel_startup_dir if self.kernel_startup else None)


def add_fragment(pod, fragment: Fragment, startup_dir: str | None = None):
    """``pod`` (KubeSpawner's V1Pod) with the fragment's resources, placement and annotations
    on its notebook container (the first). Every changed field gets a new object: KubeSpawner
    puts trait values (node_selector, extra_resource_limits…) into the pod as they are, and
    changing those in place would change the configuration for later spawns."""
    container = pod.spec.containers[0]
    if fragment.limits:
        resources = container.resources = container.resources or V1ResourceRequirements()
        resources.limits = {**(resources.limits or {}), **fragment.limits}
    if fragment.node_selector:
        pod.spec.node_selector = {**(pod.spec.node_selector or {}), **fragment.node_selector}
    if fragment.tolerations:
        pod.spec.tolerations = list(pod.spec.tolerations or []) + [
            get_k8s_model(V1Toleration, t) for t in fragment.tolerations]
    if fragment.annotations:
        pod.metadata.annotations = {**(pod.metadata.annotations or {}), **fragment.annotations}
    if startup_dir and STARTUP_ANNOTATION in fragment.annotations:
        pod.spec.volumes = list(pod.spec.volumes or []) + [V1Volume(
            name=STARTUP_VOLUME, downward_api=V1DownwardAPIVolumeSource(items=[
                V1DownwardAPIVolumeFile(path="pythonstartup.py", field_ref=V1ObjectFieldSelector(
                    field_path=f"metadata.annotations['{STARTUP_ANNOTATION}']"))]))]
        container.volume_mounts = list(container.volume_mounts or []) + [V1VolumeMount(
            name=STARTUP_VOLUME, mount_path=startup_dir, read_only=True)]
    return pod


def _startup_source() -> str:
    return Path(__file__).with_name("pythonstartup.py").read_text()
