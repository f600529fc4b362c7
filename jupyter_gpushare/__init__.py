"""jupyter-gpushare: fractional GPU slices for notebooks and a guaranteed-quota train pool."""

__version__ = "0.1.0"
