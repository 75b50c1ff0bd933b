"""Fairring: a PyTorch distributed backend with a hierarchical, reduction-server
all-reduce.  Importing this package registers the backend ``"fairring"``::

    import torch.distributed as dist
    import fairring_py
    dist.init_process_group("fairring")

When the package is installed, torch registers the backend by itself at
``import torch`` (see ``_fairring_autoload``), and the import is optional.
"""

import atexit
import os
import warnings
from collections import Counter

import torch
import torch.distributed as dist

from . import _C  # noqa: E402  (needs torch.distributed's bindings loaded first)
from .options import Options, resolve as _resolve, node_key as _node_key
from . import _status_listener as _status

__all__ = ["Options", "BACKEND_NAME", "dump_recent"]
__version__ = "0.1.0"

BACKEND_NAME = "fairring"

# Before the interpreter finalizes: the engines' threads must not be the ones
# to drop the last reference to a tensor then (that needs the GIL, which a
# finalizing interpreter no longer hands out).
atexit.register(_C._quiesce_all)

# What crashed jobs of this user left in /dev/shm (fairring_py.cleanup).
try:
    _C._sweep_stale_segments()
except Exception:  # noqa: BLE001  (a sweep must never stop an import)
    pass


def _create_backend(dist_opts, pg_options):
    """Called by torch.distributed for every process group using "fairring"."""
    store = dist_opts.store
    rank, size, timeout = dist_opts.group_rank, dist_opts.group_size, dist_opts.timeout
    # A bad option on one rank must fail every rank's creation at once, not
    # leave the others waiting for it in gloo's rendezvous below.
    try:
        resolved = _resolve(pg_options)
    except Exception as e:
        _C._init_failed(store, rank, size, timeout, f"{type(e).__name__}: {e}")
        raise
    if getattr(dist_opts, "enable_reconfigure", False):
        return _reconfigurable(store, rank, size, timeout, resolved)
    backend = _build(store, rank, size, timeout, resolved)
    ranks = list(getattr(dist_opts, "global_ranks_in_group", None) or [])
    if len(ranks) != size and not dist.is_initialized():
        ranks = list(range(size))  # the default group: its ranks are the job's
    if len(ranks) == size:
        backend._set_global_ranks(ranks)
    _register_status(backend, store, ranks if len(ranks) == size else None)
    return backend


def _register_status(backend, store, ranks):
    try:
        _status.register(backend, store, ranks)
    except Exception as e:  # noqa: BLE001  (the status view must never fail a group's creation)
        warnings.warn(f"fairring: the status view (fairring_py.status) could not register this rank: {e}",
                      stacklevel=3)


def _reconfigurable(store, rank, size, timeout, resolved):
    """A group created with enable_reconfigure=True (torch >= 2.14): no members
    until its first reconfigure(), which builds them here (``_build``)."""
    if not _C.HAS_RECONFIGURE:
        raise RuntimeError(
            f"fairring: enable_reconfigure=True needs the reconfigure API of torch >= 2.14; this build of "
            f"fairring_py was compiled against a torch without it (now running {torch.__version__})"
        )
    return _C.ReconfigurableBackend(
        store, rank, size, timeout, lambda store, rank, size, timeout: _build(store, rank, size, timeout, resolved)
    )


def _build(store, rank, size, timeout, resolved):
    """A Fairring backend with `resolved` options; the groups made from it
    (shrink, split) are built here too, with the same options."""
    _C._init_checkpoint(store, rank, size, timeout, "options")
    # What Fairring does not run itself goes to gloo, on its own corner of the store.
    fallback = _gloo_fallback(dist.PrefixStore("fairring-gloo/", store), rank, size, timeout)
    config = _C.Config()
    config.slice_size = resolved.slice_size
    config.slice_size_auto = resolved.slice_size_auto
    config.total_memory = resolved.total_memory
    config.parallelism = resolved.parallelism
    config.socket_ifname = resolved.socket_ifname
    config.gpu_transport = resolved.gpu_transport
    config.wire_dtype = resolved.wire_dtype
    config.huge_pages = resolved.huge_pages
    config.reduction_servers = resolved.reduction_servers
    config.rail_radix = resolved.rail_radix
    config.timeout = timeout
    backend = _C.FairringBackend(store, rank, size, config, _node_key(resolved), fallback)
    # Captures the options, never the backend (no reference cycle).
    backend._set_child_factory(lambda store, rank, size, timeout: _build(store, rank, size, timeout, resolved))
    if rank == 0 and backend.topology()["uneven"]:
        _warn_uneven(backend.node_keys())
    return backend


def _gloo_fallback(store, rank, size, timeout):
    """The gloo group a Fairring group delegates to, connecting lazily: each
    pair of ranks connects the first time a delegated op uses it, so a group
    that never delegates never builds gloo's full mesh (N(N-1)/2 connections
    at creation, the larger part of creating a group of many ranks).  Devices
    as torch makes them for gloo (GLOO_SOCKET_IFNAME, else the host's
    address); a torch without lazy devices gets gloo's usual group."""
    try:
        ifnames = [i for i in os.environ.get("GLOO_SOCKET_IFNAME", "").split(",") if i]
        if ifnames:
            devices = [dist.ProcessGroupGloo.create_device(interface=i, lazy_init=True) for i in ifnames]
        else:
            devices = [dist.ProcessGroupGloo.create_default_device(lazy_init=True)]
    except (AttributeError, TypeError):
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = devices
    return dist.ProcessGroupGloo(store, rank, size, opts)


def _warn_uneven(node_keys):
    counts = Counter(node_keys)
    sizes = ", ".join(f"{key!r}: {n}" for key, n in counts.items())
    warnings.warn(
        f"fairring: the nodes of this process group have different numbers of ranks ({sizes}); "
        "collectives stay hierarchical with one rail per rank of the smallest node: the other ranks "
        "share their node's memory, and their pieces travel on their node-mates' rails, so the larger "
        "nodes have fewer rails per rank (CUDA tensors run flat, every rank its own node). "
        "Results are correct either way.",
        stacklevel=3,
    )


# Registered already when torch's autoload ran _fairring_autoload.register(),
# whose creator comes here once this package is imported.
if not hasattr(dist.Backend, BACKEND_NAME.upper()):
    dist.Backend.register_backend(
        BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"]
    )


def dump_recent(group=None, file=None):
    """The last collectives of a Fairring process group (the default group if
    None), oldest first: their sequence number, kind, size, state ("in flight",
    "done", "failed", "delegated" to gloo) and timings.  Printed to ``file``
    (if given) one per line, and returned as a list of dicts.  The same list
    is written to stderr by itself when the group's first collective fails."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    backend = pg._get_backend(torch.device("cpu"))
    if _C.HAS_RECONFIGURE and isinstance(backend, _C.ReconfigurableBackend):
        backend = backend.current()
        if backend is None:
            return []  # no members yet, no collectives
    if not isinstance(backend, _C.FairringBackend):
        raise ValueError(f"fairring: dump_recent needs a Fairring process group, got {type(backend).__name__}")
    if file is not None:
        print(backend.format_recent_ops(), end="", file=file)
    return backend.recent_ops()
