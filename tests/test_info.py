"""python -m fairring_py.info: the report a user pastes into a bug report."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args, env=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("FAIRRING_")}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "fairring_py.info", *args], cwd=REPO, env=e,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)


def test_info_json_reports_build_and_options():
    r = _run("--json", env={"FAIRRING_SLICE_SIZE": "256K", "FAIRRING_NODE_ID": "rack7"})
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["build"]["torch_built_against"] == torch.__version__.split("+")[0]
    assert info["build"]["cuda"] in (True, False)
    assert info["torch"] == torch.__version__
    assert info["options"]["slice_size"] == 256 * 1024
    assert info["options"]["parallelism"] == 4  # the default, from the extension
    assert info["node_key"] == "id:rack7"
    assert info["environment"] == {"FAIRRING_NODE_ID": "rack7", "FAIRRING_SLICE_SIZE": "256K"}


def test_info_text_and_bad_option():
    r = _run()
    assert r.returncode == 0, r.stderr
    assert "torch_built_against" in r.stdout and "slice_size: 1048576" in r.stdout
    bad = _run(env={"FAIRRING_PARALLELISM": "0"})
    assert bad.returncode == 1
    assert "FAIRRING_PARALLELISM" in bad.stdout


def test_info_reports_the_autoload():
    r = _run("--json", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    assert r.returncode == 0, r.stderr
    auto = json.loads(r.stdout)["autoload"]
    # The entry point exists only where the package's metadata is installed.
    if auto["entry_point"] is None:
        assert auto["registered_by"] == "fairring_py", auto
    else:
        assert auto["entry_point"] == "fairring = _fairring_autoload:register", auto
        assert auto["registered_by"] == "_fairring_autoload", auto
    r = _run("--json", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    auto = json.loads(r.stdout)["autoload"]
    assert auto["TORCH_DEVICE_BACKEND_AUTOLOAD"] == "0" and auto["registered_by"] == "fairring_py", auto
