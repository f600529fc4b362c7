"""The pool service's HTTP side: the REST API's handlers, the identity JupyterHub gives a request,
and the admin dashboard's pages and forms."""
