"""Argument handling shared by the reference drivers."""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from llama_ref import LlamaConfig  # noqa: E402


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", required=True, help="HF config.json")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (= ORT intra-op threads)")
    return p


def setup(args: argparse.Namespace) -> LlamaConfig:
    torch.set_num_threads(max(1, args.threads))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set (only allowed once per process)
    torch.manual_seed(0)
    return LlamaConfig.load(args.config)


def emit(obj: object) -> None:
    """One JSON line on stdout: the drivers' only stdout output."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()
