"""Fairring's ops in torch's flight recorder: every op recorded as gloo and
NCCL record theirs (names, sequence ids, sizes, dtypes, states, the group's
ranks), dumped by every rank when its group fails
(TORCH_FR_DUMP_ON_TIMEOUT=1), and torch's analyzer, run on those dumps
through fairring_py.fr_trace, names the collective and the rank that broke
step."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

import launch
import rank_flight_recorder as rfr
from fairring_py import fr_trace
from topologies import node_ids

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_op_is_recorded_in_torchs_flight_recorder():
    res = launch.run_ranks(rfr.records, node_ids("1x3"), timeout_s=120, pg_timeout_s=60)
    for r in res:
        v = r.value
        assert v["recorder"] == {"on": True, "problem": ""}, v["recorder"]
        delegated = [e for e in v["entries"] if e["profiling_name"].startswith("gloo:")]
        assert [(e["profiling_name"], tuple(e["process_group"])) for e in delegated] == [
            ("gloo:sparse_all_reduce", ("0", "default_pg"))], (delegated, v["refused"])
        default = [e for e in v["entries"] if e["process_group"][0] == "0" and e not in delegated]
        names = [e["profiling_name"] for e in default]
        expected = ["fairring:all_reduce", "fairring:all_gather", "fairring:reduce_scatter", "fairring:broadcast",
                    "fairring:all_gatherv"]
        expected += {0: ["fairring:send 0->1"], 1: ["fairring:recv 1<-0"], 2: []}[r.rank]
        expected += ["fairring:barrier"]
        assert names == expected, f"rank {r.rank}: {names}"
        # Collectives and point-to-point ops numbered apart, as the analyzer matches them.
        assert [e["collective_seq_id"] for e in default if not e["is_p2p"]] == [1, 2, 3, 4, 5, 6], default
        assert [e["p2p_seq_id"] for e in default if e["is_p2p"]] == ([1] if r.rank < 2 else [])
        ar, ag, rs, uneven = default[0], default[1], default[2], default[4]
        assert uneven["input_sizes"] == [[r.rank + 1]] and uneven["output_sizes"] == [[1], [2], [3]], uneven
        assert ar["input_sizes"] == [[5]] and ar["output_sizes"] == [[5]] and ar["input_dtypes"] == ["Float"], ar
        assert ag["input_sizes"] == [[5]] and ag["output_sizes"] == [[15]], ag
        assert rs["input_sizes"] == [[6]] and rs["output_sizes"] == [[2]] and rs["output_dtypes"] == ["Double"], rs
        for e in default:
            assert e["state"] == "completed" and e["retired"], e
            assert e["timeout_ms"] == 60000, e
        assert v["pg_config"]["0"]["ranks"] == "[0, 1, 2]", v["pg_config"]
        if r.rank in (1, 2):
            sub = [e for e in v["entries"] if e["process_group"][0] == v["sub_name"]]
            assert [(e["profiling_name"], e["input_dtypes"], e["collective_seq_id"]) for e in sub] == [
                ("fairring:all_reduce", ["Int"], 1)
            ], sub
            assert v["pg_config"][v["sub_name"]]["ranks"] == "[1, 2]", v["pg_config"]
        # The split's child: built by Fairring (split), named by its global ranks.
        assert v["pg_config"][v["split_name"]]["ranks"] == ("[1]" if r.rank == 1 else "[0, 2]"), v["pg_config"]


DESYNCS = {
    # (nodes, how the culprit differs, the culprit, what the analyzer says).
    # A skipped collective is a type mismatch; which side the analyzer calls
    # the culprit then depends on the dump it reads first, so only the op's
    # two types are checked.
    "1x3-size": (node_ids("1x3"), "size", 1,
                 ["Culprit rank 1", "Expected input sizes: '[[10]]' does not match found input sizes: '[[7]]'"]),
    "2x2-dtype": (node_ids("2x2"), "dtype", 2, ["Culprit rank 2", "COLLECTIVE_DTYPE_MISMATCH", "Double"]),
    "2x2-skip": (node_ids("2x2"), "skip", 3, ["COLLECTIVE_TYPE_MISMATCH", "'broadcast'", "'all_reduce'"]),
}


@pytest.mark.parametrize("case", list(DESYNCS))
def test_torchs_analyzer_names_the_rank_out_of_step(case, tmp_path):
    nodes, how, culprit, words = DESYNCS[case]
    folder = str(tmp_path / "dumps")
    os.makedirs(folder)
    env = {"TORCH_FR_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": os.path.join(folder, "rank_")}
    res = launch.run_ranks(rfr.desync, nodes, args=(how, culprit, folder), timeout_s=120, pg_timeout_s=30, env=env)
    for r in res:
        assert r.value["error"] and "mismatch" in r.value["error"], f"rank {r.rank}: {r.value}"
        assert r.value["dumped"], f"rank {r.rank} left no dump in {folder}: {os.listdir(folder)}"
        with open(os.path.join(folder, f"rank_{r.rank}"), "rb") as f:
            third = [e for e in pickle.load(f)["entries"] if e["collective_seq_id"] == 3]
        # The failed op: retired, not completed (as torch's recorders leave an op that timed out).
        assert third and third[0]["retired"] and third[0]["state"] != "completed", third
    p = subprocess.run([sys.executable, "-m", "fairring_py.fr_trace", folder, "-p", "rank_"], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    assert "Collective sequence number: 3 has errors" in p.stdout, p.stdout
    for w in words:
        assert w in p.stdout, f"{w!r} not in:\n{p.stdout}"


def test_names_are_translated_for_the_analyzer_and_nothing_else():
    assert fr_trace.translate_entry_name("fairring:all_reduce") == "gloo:all_reduce"
    assert fr_trace.translate_entry_name("fairring:send 0->1") == "gloo:send 0->1"
    assert fr_trace.translate_entry_name("fairring:all_reduce_coalesced") == "gloo:allreduce_coalesced"
    assert fr_trace.translate_entry_name("nccl:broadcast") == "nccl:broadcast"


def test_fr_trace_says_how_to_call_it(tmp_path, capsys):
    assert fr_trace.main([]) == 2
    assert fr_trace.USAGE in capsys.readouterr().err
    missing = str(tmp_path / "nowhere")
    assert fr_trace.main([missing]) == 2
    assert f"{missing} is not a folder of dumps" in capsys.readouterr().err
    assert fr_trace.main([str(tmp_path)]) == 2
    assert f"no dumps in {tmp_path}" in capsys.readouterr().err
    (tmp_path / "rank_0").write_bytes(b"not a pickle")
    with pytest.raises(SystemExit, match="is not a flight-recorder dump"):
        fr_trace.main([str(tmp_path)])


def test_recorder_turned_off_says_so():
    code = "import json, fairring_py; print(json.dumps(fairring_py._C._flight_recorder()))"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, TORCH_FR_BUFFER_SIZE="0"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got == {"on": False, "problem": "torch's flight recorder is off (TORCH_FR_BUFFER_SIZE=0)"}, got


@pytest.mark.parametrize("nodes,culprit", [(node_ids("1x3"), 2), (node_ids("2x2"), 1)], ids=["1x3", "2x2"])
def test_a_stalled_rank_dumps_too(nodes, culprit, tmp_path):
    """The ranks that time out waiting for a stalled one dump, and ask every
    rank to: the stalled rank's dump is in the folder too, with its two
    completed all-reduces, and the analyzer names it as the one missing."""
    folder = str(tmp_path / "dumps")
    os.makedirs(folder)
    env = {"TORCH_FR_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": os.path.join(folder, "rank_")}
    res = launch.run_ranks(rfr.stalled, nodes, args=(culprit, folder), timeout_s=120, pg_timeout_s=5, env=env)
    for r in res:
        assert r.value["dumped"], f"rank {r.rank} left no dump in {folder}: {os.listdir(folder)}"
        if r.rank != culprit:
            assert r.value["error"] and "Timed out" in r.value["error"], f"rank {r.rank}: {r.value}"
    with open(os.path.join(folder, f"rank_{culprit}"), "rb") as f:
        entries = [e for e in pickle.load(f)["entries"] if e["profiling_name"] == "fairring:all_reduce"]
    assert [e["collective_seq_id"] for e in entries] == [1, 2], entries
    assert all(e["state"] == "completed" for e in entries), entries
    p = subprocess.run([sys.executable, "-m", "fairring_py.fr_trace", folder, "-p", "rank_"], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    assert "Not all ranks joining collective, sequence number: 3" in p.stdout, p.stdout
    assert f"missing ranks: {{{culprit}}}" in p.stdout, p.stdout


def test_without_the_listeners_a_stalled_rank_does_not_dump(tmp_path):
    """The control: with FAIRRING_STATUS=off nobody can ask the stalled rank,
    and its dump does not come (the others' do)."""
    folder = str(tmp_path / "dumps")
    os.makedirs(folder)
    env = {"TORCH_FR_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": os.path.join(folder, "rank_"),
           "FAIRRING_STATUS": "off"}
    res = launch.run_ranks(rfr.stalled, node_ids("1x3"), args=(2, folder, 12.0), timeout_s=120, pg_timeout_s=5,
                           env=env)
    assert [r.value["dumped"] for r in res] == [True, True, False], [r.value for r in res]
