"""What this machine can run jobs on (the only place outside job processes that asks torch)."""

from __future__ import annotations


def cuda_problem() -> str:
    """Why a CUDA worker cannot run here ("" when it can)."""
    try:
        import torch  # noqa: PLC0415 - only a CUDA worker asks, and torch takes a second to import
    except ImportError:
        return "torch is not installed (pip install 'gavel[worker]')"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device on this machine"
    return ""
