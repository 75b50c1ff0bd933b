"""PyTorch's own DistributedTest cases (torch.testing._internal) for send /
recv / any source / tags / batch_isend_irecv and all-to-all of equal and
unequal splits, run on Fairring as torch runs them on its backends
(tests/scripts/torch_cases.py says how, and which backend-name gates it
lifts).  Needs torch's test dependency expecttest."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "torch_cases.py")
CASES = ["test_send_recv", "test_send_recv_any_source", "test_send_recv_with_tag", "test_isend", "test_irecv",
         "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags", "test_all_to_all",
         "test_all_to_all_single_equal_split", "test_all_to_all_single_unequal_split",
         "test_all_to_all_single_unequal_split_group", "test_all_to_all_group"]


def test_torch_distributed_cases_pass_on_fairring(tmp_path):
    pytest.importorskip("expecttest", reason="torch's test cases need expecttest (pip install expecttest)")
    args = [sys.executable, SCRIPT, "--backend", "fairring", "--world-size", "3",
            "--json", str(tmp_path / "cases.json")]
    for name in CASES:
        args += ["--only", name]
    p = subprocess.run(args, capture_output=True, text=True, timeout=600)
    summary = p.stdout[p.stdout.find("=== backend="):]
    assert p.returncode == 0, summary + p.stderr[-3000:]
    import json

    res = json.load(open(tmp_path / "cases.json"))["tests"]
    ran = {n for n, v in res.items() if v["status"] == "PASS"}
    for name in CASES:
        assert name in ran, f"{name}: {res.get(name)}\n{summary}"
