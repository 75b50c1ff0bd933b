"""Registers the "fairring" backend when torch is imported, so that
``init_process_group("fairring")`` works without ``import fairring_py``.

torch calls ``register()`` through its device-backend autoload (the
``torch.backends`` entry point group, declared in setup.py) near the end of
``import torch``, unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.  torch turns an
exception from an entry point into a failed ``import torch``, so ``register``
catches everything and only warns.  It is a top-level module on purpose:
loading an entry point imports its package first, and ``fairring_py``'s
``__init__`` loads the C++ extension.  Here only the backend's name is
registered, with a creator that imports ``fairring_py`` when the first
Fairring process group is created; a broken extension (built against another
torch, say) then fails that ``init_process_group`` with its real error, never
``import torch``.

Importing ``fairring_py`` as well is fine: it sees the name registered and
keeps this registration.
"""

BACKEND_NAME = "fairring"


def _create_backend(dist_opts, pg_options):
    try:
        import fairring_py
    except Exception as e:
        raise RuntimeError(
            f"fairring: torch's autoload registered the backend {BACKEND_NAME!r}, but "
            f"fairring_py failed to import: {type(e).__name__}: {e}"
        ) from e
    return fairring_py._create_backend(dist_opts, pg_options)


def register():
    """The ``torch.backends`` entry point.  Never raises."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        if hasattr(dist.Backend, BACKEND_NAME.upper()):
            return  # registered already (fairring_py imported, or a second call)
        dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"]
        )
    except Exception as e:  # noqa: BLE001  (anything here would break `import torch`)
        try:
            import warnings

            warnings.warn(
                f"fairring: could not register the backend {BACKEND_NAME!r} at torch import "
                f"({type(e).__name__}: {e}); `import fairring_py` registers it explicitly",
                RuntimeWarning,
                stacklevel=2,
            )
        except Exception:  # noqa: BLE001
            pass
