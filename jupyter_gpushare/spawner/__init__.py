"""Build slices: JupyterHub spawners that give every notebook server a fixed slice of a GPU.

``LocalGPUShareSpawner`` (entry point ``gpushare-local``) and ``GPUShareKubeSpawner``
(``gpushare-kubernetes``). ``modes`` turns slice sizes into environment and pod fragments,
``profiles`` the admin's slice configuration into build profiles, ``reserve`` talks to the
pool service, ``base`` holds the lifecycle both spawners share, ``kernel`` runs in kernels.
"""

__all__ = ["LocalGPUShareSpawner", "GPUShareKubeSpawner"]


def __getattr__(name):
    # Imported on first use: the kernel start-up code imports this package, and the local
    # spawner's hub need not load the Kubernetes client.
    if name == "LocalGPUShareSpawner":
        from .local import LocalGPUShareSpawner
        return LocalGPUShareSpawner
    if name == "GPUShareKubeSpawner":
        from .kube import GPUShareKubeSpawner
        return GPUShareKubeSpawner
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
