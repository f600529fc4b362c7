"""The scheduling cycle as it was before the victim index (commit 83e7885), kept unchanged
as the reference that tests/test_policy_equality.py and benchmarks/reclaim_burst.py hold the
live ``jupyter_gpushare.policy`` to: the same snapshot must give the same decisions.

Only the modules the victim index changed are copied, byte for byte. The others are the live
ones, unchanged since: ``model`` above all (both policies decide over the same values, and
``Queues`` compares job states by identity), and ``queues``, ``reasons`` and ``shares``.
"""

import sys

from jupyter_gpushare.policy import model, queues, reasons, shares

for _live in (model, queues, reasons, shares):
    sys.modules[f"{__name__}.{_live.__name__.rsplit('.', 1)[1]}"] = _live

from .cycle import cycle  # noqa: E402  (after the model is in place)

__all__ = ["cycle"]
