"""Fairring for torchft, PyTorch's fault-tolerant training: a process group that
torchft's Manager re-forms per quorum (``configure``), as it does its own gloo
and NCCL groups::

    from torchft import Manager
    from fairring_py.torchft import ProcessGroupFairring

    manager = Manager(pg=ProcessGroupFairring(timeout=timedelta(seconds=10)), ...)

Each ``configure`` builds a new Fairring group on the quorum's store (the old
one is aborted first); a rank whose group goes away (``shutdown``, a crash)
is named on the others at once, and ``errored()`` says when the group failed,
so that the Manager re-forms it.  Needs the ``torchft`` package.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Optional

import torch
from torch.distributed import ProcessGroup as BaseProcessGroup
from torchft.process_group import ProcessGroupWrapper

from . import _build
from .options import Options, resolve

_ERROR_NAMES = {1: "timed out", 2: "failed", 3: "failed on another rank"}


class ProcessGroupFairring(ProcessGroupWrapper):
    """A reconfigurable Fairring process group (CPU tensors, and CUDA
    tensors where the extension has its CUDA parts).  ``options``: Fairring's
    options (``fairring_py.Options``) for every group it forms."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60), options: Optional[Options] = None) -> None:
        super().__init__(timeout=timeout)
        self._options = options
        self._backend = None

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        backend = _build(store, rank, world_size, self._timeout, resolve(self._options))
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
        pg._register_backend(torch.device("cpu"), BaseProcessGroup.BackendType.CUSTOM, backend)
        if torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), BaseProcessGroup.BackendType.CUSTOM, backend)
        self._backend = backend
        return pg

    def getBackendName(self) -> str:
        return "torchft-fairring"

    def set_timeout(self, timeout: timedelta) -> None:
        # The live group's waits from now on, and every group formed later.
        super().set_timeout(timeout)
        if self._backend is not None:
            self._backend.set_timeout(timeout)

    def abort(self, errored: bool = True) -> None:
        super().abort(errored=errored)
        self._backend = None

    def shutdown(self) -> None:
        # Leaves the group now, so the peers learn it at once (dropping the
        # group would too, but only once the last reference to it is gone).
        if self._backend is not None:
            self._backend.shutdown()
            self._backend = None
        super().shutdown()

    def errored(self) -> Optional[Exception]:
        backend = self._backend
        if backend is None:
            return None
        kind, why = backend.error()
        if kind == 0:
            return None
        return RuntimeError(f"fairring: the process group {_ERROR_NAMES.get(kind, 'failed')} and its operations "
                            f"were aborted: {why}")
