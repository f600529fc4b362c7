"""The Kubernetes backend: train jobs as pods on a Kubernetes train pool
(``c.PoolService.backend_class = "kubernetes"``)."""

from .backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
