"""What this machine can run jobs on (the only place outside job processes that asks torch)."""

from __future__ import annotations

import importlib.util
import sys


def torch_problem() -> str:
    """Why this interpreter cannot run training jobs ("" when it can): catalog workloads and the
    users' `python` (this interpreter, first on a job's PATH) need torch."""
    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed for {sys.executable} (pip install 'gavel-scheduler[worker]')"
    return ""


def cuda_problem() -> str:
    """Why a CUDA worker cannot run here ("" when it can)."""
    try:
        import torch  # noqa: PLC0415 - only a CUDA worker asks, and torch takes a second to import
    except ImportError:
        return "torch is not installed (pip install 'gavel[worker]')"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device on this machine"
    return ""
