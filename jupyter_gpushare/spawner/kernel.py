"""Inside a notebook kernel: what the spawner's slice asks of Python code.

The spawners set ``PYTHONSTARTUP`` to ``pythonstartup.py``, which IPython kernels run at
start; it calls :func:`start`, which

- loads the ``jupyter_gpushare`` IPython extension (``%%train``, ``%gpushare``), and
- caps PyTorch's memory to the slice: when ``torch`` is imported, and only then (importing
  torch stays as fast as ever, and a kernel that never uses CUDA never makes a CUDA context),
  ``torch.cuda.set_per_process_memory_fraction`` is queued for when CUDA starts. Like every
  framework cap it binds the caching allocator of this process only.

It never raises: a kernel must start even when the slice cannot be applied; it says why in
one line on stderr (the server's log).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

EXTENSION = "jupyter_gpushare"
TORCH_FRACTION_VARIABLE = "GPUSHARE_TORCH_MEMORY_FRACTION"
"""Set by the slicing modes (``modes.framework_caps``): PyTorch's per-process memory fraction."""


def start() -> None:
    fraction = os.environ.get(TORCH_FRACTION_VARIABLE)
    if fraction:
        try:
            cap_torch(float(fraction))
        except ValueError:
            _say(f"{TORCH_FRACTION_VARIABLE}={fraction!r} is not a number; PyTorch is not capped")
    shell = _ipython()
    if shell is not None:
        try:
            shell.extension_manager.load_extension(EXTENSION)
        except Exception as exc:  # the kernel must start anyway
            _say(f"the {EXTENSION} IPython extension did not load ({type(exc).__name__}: "
                 f"{exc}); %load_ext {EXTENSION} shows why")


def cap_torch(fraction: float) -> None:
    """Apply ``fraction`` to every CUDA device torch sees, once torch is imported (now, if it
    already is)."""
    if not 0 < fraction <= 1:
        raise ValueError(fraction)
    if "torch" in sys.modules:
        _queue_cap(sys.modules["torch"], fraction)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport("torch", lambda torch: _queue_cap(torch, fraction)))


def _queue_cap(torch, fraction: float) -> None:
    def apply():
        for device in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, device)

    try:
        if torch.cuda.is_initialized():
            apply()
        else:
            # torch's own queue of calls for when CUDA starts (what manual_seed uses).
            torch.cuda._lazy_call(apply)
    except Exception as exc:
        _say(f"PyTorch could not be capped to {fraction:g} of the GPU's memory "
             f"({type(exc).__name__}: {exc})")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then(module)`` right after ``name`` is first imported, then steps aside."""

    def __init__(self, name: str, then):
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # let the other finders find the real module
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def __getattr__(self, name):  # get_resource_reader, is_package…: the real loader's
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader
        try:
            self.then(module)
        except Exception as exc:
            _say(f"the slice's cap for {module.__name__} failed ({type(exc).__name__}: {exc})")


def _ipython():
    if "IPython" not in sys.modules:
        return None
    try:
        return sys.modules["IPython"].get_ipython()
    except Exception:
        return None


def _say(message: str) -> None:
    print(f"gpushare: {message}", file=sys.stderr)
