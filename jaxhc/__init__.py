"""jaxhc: compressed collectives (ZFP, MPC) for JAX/XLA training of GPT-style models."""

from jaxhc import codecs as codecs

__version__ = "0.1.0"

__all__ = ["codecs"]
