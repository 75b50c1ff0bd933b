"""init_process_group("fairring") without `import fairring_py`: torch's
device-backend autoload (entry point group "torch.backends") registers the
backend at `import torch`, and a failure there never breaks `import torch`.

Every case runs in a fresh interpreter (the autoload happens once, inside
`import torch`).  The first test uses the entry point of the installed package
(`pip install -e .`, as .ci/run does) and skips without it; the others put a
stand-in "fairring" distribution (its metadata only, pointing at this tree's
_fairring_autoload) first on the path, so they also run from a source tree,
and can add a second entry point that runs before Fairring's to break what it
relies on.
"""
from __future__ import annotations

import importlib.machinery
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

import launch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "scripts", "autoload_check.py")
# What setup.py declares (checked below); the stand-in distributions declare the same.
ENTRY_POINT = "fairring = _fairring_autoload:register"
DEADLINE_S = 150


def _env(*paths, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FAIRRING_", "TORCH_DEVICE_BACKEND_AUTOLOAD"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env["OMP_NUM_THREADS"] = "1"
    # This tree's modules (the package may be built in place rather than installed).
    env["PYTHONPATH"] = os.pathsep.join(list(paths) + [REPO] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(extra)
    return env


def _python(code, env, cwd):
    # cwd: `python -c` puts it first on sys.path, before PYTHONPATH.
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=DEADLINE_S)
    result = None
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT "):])
    return r, result


def _stand_in(tmp_path, entry_points, modules=None):
    """A directory holding a distribution named "fairring" (metadata only) whose
    torch.backends entry points are `entry_points`, in that order (torch calls
    them in the order of the file), plus the given modules' sources."""
    info = tmp_path / "fairring-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fairring\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\n" + "\n".join(entry_points) + "\n")
    for name, src in (modules or {}).items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(src))
    return str(tmp_path)


def test_setup_declares_the_entry_point():
    with open(os.path.join(REPO, "setup.py")) as f:
        setup_py = f.read()
    assert f'"torch.backends": ["{ENTRY_POINT}"]' in setup_py
    assert 'py_modules=["_fairring_autoload", "fairring"]' in setup_py


def _installed_entry_point():
    for ep in importlib.metadata.entry_points(group="torch.backends"):
        if ep.name == "fairring":
            return ep
    return None


def test_installed_package_autoloads_under_torchrun():
    ep = _installed_entry_point()
    if ep is None:
        pytest.skip("no 'fairring' entry point in group torch.backends: the package's metadata is not "
                    "installed (a source tree without `pip install -e .`)")
    assert f"{ep.name} = {ep.value}" == ENTRY_POINT
    port = launch.free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={port}", SCRIPT]
    p = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"torchrun did not finish within {DEADLINE_S}s:\n{out[-6000:]}")
    assert p.returncode == 0, f"torchrun exit code {p.returncode}\n{out[-6000:]}"
    # The two ranks share torchrun's stdout: their lines may run into each other.
    lines = re.findall(r"FAIRRING_AUTOLOAD_OK rank=\d+ world=\d+ recent=\[[^\]]*\]", out)
    assert sorted(lines) == [
        f"FAIRRING_AUTOLOAD_OK rank={r} world=2 recent=['all_reduce']" for r in (0, 1)
    ], out[-6000:]


# A one-rank group, created after the checks in `before`.
_ONE_RANK = """
import json, sys
import torch, torch.distributed as dist
out = {"registered": hasattr(dist.Backend, "FAIRRING"), "imported": "fairring_py" in sys.modules}
%s
try:
    dist.init_process_group("fairring", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
    t = torch.arange(10.0)
    dist.all_reduce(t)
    out["backend"] = type(dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))).__name__
    out["creator"] = dist.Backend._plugins["FAIRRING"].creator_fn.__module__
    dist.destroy_process_group()
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps(out), flush=True)
"""


def test_autoload_then_import(tmp_path):
    """Autoload registers the name only; an explicit import afterwards is
    accepted and keeps that registration; the group loads the package."""
    path = _stand_in(tmp_path, [ENTRY_POINT])
    r, res = _python(_ONE_RANK % ("import fairring_py", launch.free_port()), _env(path), path)
    assert res == {"registered": True, "imported": False, "backend": "FairringBackend",
                   "creator": "_fairring_autoload"}, r.stderr[-4000:]
    assert "fairring" not in r.stderr, r.stderr[-4000:]  # no warning


def test_autoload_disabled_then_import(tmp_path):
    """TORCH_DEVICE_BACKEND_AUTOLOAD=0: torch skips the entry point, and
    `import fairring_py` registers the backend itself."""
    path = _stand_in(tmp_path, [ENTRY_POINT])
    code = _ONE_RANK % (
        'out["registered_before_import"] = hasattr(dist.Backend, "FAIRRING")\nimport fairring_py',
        launch.free_port())
    r, res = _python(code, _env(path, TORCH_DEVICE_BACKEND_AUTOLOAD="0"), path)
    assert res == {"registered": False, "imported": False, "registered_before_import": False,
                   "backend": "FairringBackend", "creator": "fairring_py"}, r.stderr[-4000:]


# Runs before Fairring's entry point (it comes first in the stand-in's file).
_BREAKER = """
import sys

def break_registration():
    import torch.distributed as dist

    def register_backend(*args, **kwargs):
        raise TypeError("simulated: this torch's register_backend takes other arguments")

    dist.Backend.register_backend = staticmethod(register_backend)
    print("breaker ran", file=sys.stderr, flush=True)

def raise_now():
    raise ImportError("simulated: an entry point that lets its error escape")
"""


def test_unguarded_failure_breaks_import_torch(tmp_path):
    """The control for the next test: in this setup, an entry point that
    raises does make `import torch` fail (torch's autoload re-raises)."""
    path = _stand_in(tmp_path, ["unguarded = _breaker:raise_now"], {"_breaker": _BREAKER})
    r, res = _python('import torch\nprint("RESULT {}")', _env(path), path)
    assert r.returncode != 0 and res is None, (r.stdout, r.stderr[-4000:])
    assert "simulated: an entry point that lets its error escape" in r.stderr, r.stderr[-4000:]


def test_failed_registration_does_not_break_import_torch(tmp_path):
    """register_backend raising inside Fairring's entry point (as a torch whose
    API changed would): `import torch` succeeds, with a warning."""
    path = _stand_in(tmp_path, ["breaker = _breaker:break_registration", ENTRY_POINT], {"_breaker": _BREAKER})
    code = """
        import json, sys, torch, torch.distributed as dist
        print("RESULT " + json.dumps({"sum": torch.ones(3).sum().item(),
                                      "registered": hasattr(dist.Backend, "FAIRRING"),
                                      "imported": "fairring_py" in sys.modules}))
    """
    r, res = _python(code, _env(path), path)
    assert r.returncode == 0, r.stderr[-4000:]
    assert res == {"sum": 3.0, "registered": False, "imported": False}, r.stderr[-4000:]
    assert r.stderr.index("breaker ran") < r.stderr.index("fairring: could not register the backend 'fairring'")
    assert "TypeError: simulated: this torch's register_backend takes other arguments" in r.stderr


def test_broken_extension_does_not_break_import_torch(tmp_path):
    """A package whose extension cannot load (here: not a shared object at
    all; in practice, one built against another torch): `import torch` never
    loads it; creating a Fairring group raises the loader's error."""
    pkg = tmp_path / "fairring_py"
    shutil.copytree(os.path.join(REPO, "fairring_py"), pkg,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    (pkg / ("_C" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not an ELF file\n")
    path = _stand_in(tmp_path, [ENTRY_POINT])
    r, res = _python(_ONE_RANK % ("", launch.free_port()), _env(path), path)
    assert r.returncode == 0, r.stderr[-4000:]
    assert res["registered"] is True and res["imported"] is False, (res, r.stderr[-4000:])
    err = res.get("error", "")
    assert err.startswith("RuntimeError: fairring: torch's autoload registered the backend 'fairring', "
                          "but fairring_py failed to import: ImportError:"), (res, r.stderr[-4000:])
    assert str(pkg) in err, err  # the loader names the broken file
