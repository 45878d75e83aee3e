"""Kernels that start inside a runtime environment: the provisioner and kernelspec helpers."""

from __future__ import annotations

from .kernelspec import install_kernelspec, kernelspec_dict
from .provisioner import PROVISIONER_NAME, RuntimeEnvProvisioner

__all__ = ["PROVISIONER_NAME", "RuntimeEnvProvisioner", "install_kernelspec", "kernelspec_dict"]
