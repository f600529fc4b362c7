"""The pool service: the shared train-pool scheduler that runs in JupyterHub."""
