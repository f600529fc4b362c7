"""The scheduling cycle as it was before the victim index (commit 83e7885), kept unchanged
as the reference that tests/test_policy_equality.py and benchmarks/reclaim_burst.py hold the
live ``jupyter_gpushare.policy`` to: the same snapshot must give the same decisions.

Only the modules a cycle runs are copied, byte for byte. ``model`` is not copied: both
policies decide over the same values (``TrainJob``, ``JobState``…), and ``Queues`` compares
job states by identity, so the reference must see the live module's classes.
"""

import sys

from jupyter_gpushare.policy import model

sys.modules[__name__ + ".model"] = model

from .cycle import cycle  # noqa: E402  (after the model is in place)

__all__ = ["cycle"]
