# The gpushare spawners point PYTHONSTARTUP here: IPython kernels (and interactive Pythons)
# run it in the user's namespace, so it defines nothing there. See kernel.py.
try:
    __import__("jupyter_gpushare.spawner.kernel").spawner.kernel.start()
except ImportError:
    pass
