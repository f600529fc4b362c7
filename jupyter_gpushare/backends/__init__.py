"""Where train jobs run: the Backend contract and its implementations."""

from .base import Backend, BackendError, Exit, Handle, Launch

__all__ = ["Backend", "BackendError", "Exit", "Handle", "Launch"]
