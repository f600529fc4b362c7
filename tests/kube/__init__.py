"""A real Kubernetes control plane for tests and benchmarks: build.sh (binaries), cluster.py
(etcd + apiserver + controller-manager + scheduler), kubelet.py (the node simulator),
harness.py (both together), fixtures.py (pytest fixtures ``kube_cluster`` and ``kube``)."""
