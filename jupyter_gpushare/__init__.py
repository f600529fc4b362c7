"""jupyter-gpushare: fractional GPU slices for notebooks and a guaranteed-quota train pool."""

try:
    from ._version import __version__  # written by the build from git's tags
except ImportError:  # a source tree never built or installed
    __version__ = "0.0.0+unknown"


def submit(*args, **kwargs):
    """Send work to the train pool; see :func:`jupyter_gpushare.notebook.job.submit`."""
    from .notebook.job import submit as _submit
    return _submit(*args, **kwargs)


def load_ipython_extension(ipython):
    """``%load_ext jupyter_gpushare``: the ``%%train``, ``%train`` and ``%gpushare`` magics."""
    from .notebook.magics import load_ipython_extension as _load
    _load(ipython)


def _jupyter_server_extension_points():
    """The server extension (REST handlers under ``/gpushare/api/``), enabled on install."""
    return [{"module": "jupyter_gpushare.notebook.serverext"}]


def _jupyter_labextension_paths():
    """The prebuilt JupyterLab extension (``jupyter labextension develop`` uses this)."""
    return [{"src": "labextension", "dest": "jupyter-gpushare"}]
