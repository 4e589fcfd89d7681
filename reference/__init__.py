"""The reference ownership model of a hybrid SWA KV-cache allocator (pure Python)."""

from reference import layout, names
from reference.model import Contract, Model, Violation

__all__ = ["Contract", "Model", "Violation", "layout", "names"]
