"""What a bug report needs, in one command::

    python -m fairring_py.info          # text
    python -m fairring_py.info --json   # the same as JSON

The build (CPU or CUDA, the architectures, the torch it was built against and
the one running), whether `import torch` registers the backend by itself
(torch's autoload entry point), this machine as Fairring sees it (its node identity, shared
memory, CPU features, GPUs), and the options in force for a process group
created from this environment.  Exits 1 if those options are invalid (the
error says which variable).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys

import torch

from . import _C, __version__
from .options import ENV, node_key, resolve


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return {flag: flag in have for flag in ("avx2", "f16c", "avx512f")}
    except OSError:
        pass
    return {}


def _autoload(env) -> dict:
    """Whether `import torch` registers the backend by itself (the installed
    entry point), and who registered it in this process."""
    try:
        from importlib.metadata import entry_points

        eps = [f"{ep.name} = {ep.value}" for ep in entry_points(group="torch.backends") if ep.name == "fairring"]
    except Exception as e:  # noqa: BLE001  (a report, not a check)
        eps = [f"(could not read: {type(e).__name__}: {e})"]
    plugin = getattr(torch.distributed.Backend, "_plugins", {}).get("FAIRRING")
    return {
        "entry_point": eps[0] if eps else None,
        "TORCH_DEVICE_BACKEND_AUTOLOAD": env.get("TORCH_DEVICE_BACKEND_AUTOLOAD"),
        # "_fairring_autoload": by torch's autoload; "fairring_py": by the import.
        "registered_by": getattr(getattr(plugin, "creator_fn", None), "__module__", None),
    }


def collect(environ=None) -> dict:
    env = os.environ if environ is None else environ
    info = {
        "fairring": __version__,
        "build": dict(_C._build_info()),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_flags": _cpu_flags(),
        "gpus": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }
    info["autoload"] = _autoload(env)
    try:
        shm = shutil.disk_usage("/dev/shm")
        info["dev_shm_free_bytes"] = shm.free
    except OSError:
        info["dev_shm_free_bytes"] = None
    info["environment"] = {v: env[v] for v in sorted(set(ENV.values())) if v in env}
    launch_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")
    info["launcher"] = {v: env[v] for v in launch_vars if v in env}
    try:
        resolved = resolve(None, env)
        info["options"] = {
            "slice_size": resolved.slice_size,
            "total_memory": resolved.total_memory,
            "parallelism": resolved.parallelism,
            "socket_ifname": resolved.socket_ifname or "(address of the hostname)",
            "gpu_transport": resolved.gpu_transport,
            "wire_dtype": resolved.wire_dtype,
        }
        # Ranks with the same key form a node; the others' keys are only known
        # once a group exists, so this shows this process's.
        info["node_key"] = node_key(resolved)
        info["options_error"] = None
    except (ValueError, TypeError) as e:
        info["options"] = None
        info["node_key"] = None
        info["options_error"] = str(e)
    return info


def _print_text(info: dict) -> None:
    width = max(len(k) for k in info)
    for key, value in info.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {v}")
        else:
            print(f"{key.ljust(width)}  {value}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fairring_py.info", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print JSON")
    args = p.parse_args(argv)
    info = collect()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        _print_text(info)
    return 1 if info["options_error"] else 0


if __name__ == "__main__":
    sys.exit(main())
