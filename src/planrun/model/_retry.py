"""How a model call retries a transient error: the one :class:`planrun.RetryPolicy`."""

from planrun.scheduling._retry import RetryPolicy

__all__ = ["RetryPolicy"]
