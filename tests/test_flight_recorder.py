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


# What torch's analyzer says of a broken collective: the lines that name it and the ranks.
VERDICT_WORDS = ("Not all ranks joining", "has errors", "collective:", "error msg", "missing ranks",
                 "Missing dump files", "missed FR dumps")


def _analyzer_verdict(folder, *extra):
    p = subprocess.run([sys.executable, "-m", "fairring_py.fr_trace", folder, "-p", "rank_", *extra], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode, [ln.strip() for ln in p.stdout.splitlines() if any(w in ln for w in VERDICT_WORDS)], p.stdout


def _name_gloos_groups(folder):
    """torch 2.13's gloo records its group's ranks (the dump's pg_config)
    under the empty name, before torch names the group, and the analyzer
    then cannot find them (a KeyError): they are filed under the name the
    entries carry, so that gloo's dumps can be read at all."""
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        with open(path, "rb") as f:
            dump = pickle.load(f)
        unnamed = dump["pg_config"].pop("", None)
        for uid, desc in {tuple(e["process_group"]) for e in dump["entries"]}:
            dump["pg_config"].setdefault(uid, dict(unnamed or {}, name=uid, desc=desc))
        with open(path, "wb") as f:
            pickle.dump(dump, f)


DESYNCS = {
    # (nodes, how the culprit differs, the culprit, what the analyzer says,
    # whether gloo runs the same program to its end: a size or dtype
    # mismatch aborts one of its ranks, SIGABRT, and leaves no dump).
    # A skipped collective is a type mismatch; which side the analyzer calls
    # the culprit then depends on the dump it reads first, so only the op's
    # two types are checked.
    "1x3-size": (node_ids("1x3"), "size", 1,
                 ["Culprit rank 1", "Expected input sizes: '[[10]]' does not match found input sizes: '[[7]]'"], False),
    "2x2-dtype": (node_ids("2x2"), "dtype", 2, ["Culprit rank 2", "COLLECTIVE_DTYPE_MISMATCH", "Double"], False),
    "2x2-skip": (node_ids("2x2"), "skip", 3, ["COLLECTIVE_TYPE_MISMATCH", "'broadcast'", "'all_reduce'"], True),
}


def _per_backend(tmp_path, on_gloo):
    """Fairring, and gloo where the case runs on it: each backend, its dump
    folder, and the environment that has its ranks dump there."""
    for backend in ("fairring", "gloo") if on_gloo else ("fairring",):
        folder = str(tmp_path / backend)
        os.makedirs(folder)
        yield backend, folder, {"TORCH_FR_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": os.path.join(folder, "rank_")}


@pytest.mark.parametrize("case", list(DESYNCS))
def test_torchs_analyzer_names_the_rank_out_of_step(case, tmp_path):
    nodes, how, culprit, words, on_gloo = DESYNCS[case]
    verdicts = {}
    for backend, folder, env in _per_backend(tmp_path, on_gloo):
        res = launch.run_ranks(rfr.desync, nodes, args=(how, culprit, folder), timeout_s=120, pg_timeout_s=30 if
                               backend == "fairring" else 5, env=env, backend=backend)
        if backend == "gloo":
            _name_gloos_groups(folder)
            verdicts[backend] = _analyzer_verdict(folder)
            continue
        for r in res:
            assert r.value["error"] and "mismatch" in r.value["error"], f"rank {r.rank}: {r.value}"
            assert r.value["dumped"], f"rank {r.rank} left no dump in {folder}: {os.listdir(folder)}"
            with open(os.path.join(folder, f"rank_{r.rank}"), "rb") as f:
                third = [e for e in pickle.load(f)["entries"] if e["collective_seq_id"] == 3]
            # The failed op: retired, not completed (as torch's recorders leave an op that timed out).
            assert third and third[0]["retired"] and third[0]["state"] != "completed", third
        verdicts[backend] = rc, lines, out = _analyzer_verdict(folder)
        assert rc == 0, out
        assert "Collective sequence number: 3 has errors" in lines, out
        for w in words:
            assert w in out, f"{w!r} not in:\n{out}"
    if on_gloo:
        # The same verdict for the same program's dumps from gloo (but for the
        # culprits of a type mismatch, which follow the order dumps are read in).
        fairring, gloo = ((rc, [ln for ln in lines if not ln.startswith("error msg")], out)
                          for rc, lines, out in (verdicts["fairring"], verdicts["gloo"]))
        assert fairring[:2] == gloo[:2], verdicts
        for w in words:
            assert w in gloo[2], f"gloo: {w!r} not in:\n{gloo[2]}"


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


BROKEN = {
    # (nodes, how the culprit breaks the third all-reduce, the culprit, what
    # the analyzer says of it, whether gloo runs the same program too: once
    # per case, the topology is Fairring's alone)
    "stall-1x3": (node_ids("1x3"), "stall", 2, ["Not all ranks joining collective, sequence number: 3",
                                                 "missing ranks: {2}"], True),
    "stall-2x2": (node_ids("2x2"), "stall", 1, ["Not all ranks joining collective, sequence number: 3",
                                                 "missing ranks: {1}"], False),
    "kill-1x3": (node_ids("1x3"), "kill", 1, ["Missing dump files from ranks {1}"], True),
    "kill-2x2": (node_ids("2x2"), "kill", 3, ["Missing dump files from ranks {3}"], False),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_stalled_or_killed_rank_is_named_as_on_gloo(case, tmp_path):
    """A rank stalls or is killed in the third all-reduce.  On Fairring every
    rank that is still there dumps by itself (the stalled one too: the ranks
    that time out ask every rank to), and torch's analyzer names the
    collective and the rank; run on gloo (once per case), the same program's
    dumps (written by the program: gloo dumps nothing on a failure) get the
    same words."""
    nodes, how, culprit, words, on_gloo = BROKEN[case]
    verdicts = {}
    for backend, folder, env in _per_backend(tmp_path, on_gloo):
        res = launch.run_ranks(rfr.broken, nodes, args=(how, culprit, folder), timeout_s=120, pg_timeout_s=5,
                               env=env, backend=backend, check=False)
        for r in res:
            if r.rank == culprit and how == "kill":
                assert r.exitcode == -9, launch.describe_all(res)
                continue
            assert r.ok and r.exitcode == 0, launch.describe_all(res)
            if backend == "fairring":
                assert r.value["dumped"], f"rank {r.rank} left no dump in {folder}: {os.listdir(folder)}"
            if r.rank != culprit:
                assert r.value["error"], f"{backend} rank {r.rank}: the third all_reduce did not fail"
        if backend == "fairring" and how == "stall":
            with open(os.path.join(folder, f"rank_{culprit}"), "rb") as f:
                entries = [e for e in pickle.load(f)["entries"] if e["profiling_name"] == "fairring:all_reduce"]
            assert [(e["collective_seq_id"], e["state"]) for e in entries] == [(1, "completed"), (2, "completed")]
        if backend == "gloo":
            _name_gloos_groups(folder)
        verdicts[backend] = _analyzer_verdict(folder)
        for w in words:
            assert any(w in ln for ln in verdicts[backend][1]), f"{backend}: {w!r} not in:\n{verdicts[backend][2]}"
    if on_gloo:
        assert verdicts["fairring"][:2] == verdicts["gloo"][:2], verdicts
    if how == "kill":
        # Told to go on without the dead rank's dump, the analyzer says why it cannot judge (on both).
        backends = ("fairring", "gloo") if on_gloo else ("fairring",)
        got = [_analyzer_verdict(str(tmp_path / b), "--allow-incomplete-ranks") for b in backends]
        assert got[0][0] == 0 and all(g[:2] == got[0][:2] for g in got), got
        assert any(f"missed FR dumps from ranks ({{{culprit}}})" in ln for ln in got[0][1]), got[0][2]


def test_without_the_listeners_a_stalled_rank_does_not_dump(tmp_path):
    """The control: with FAIRRING_STATUS=off nobody can ask the stalled rank,
    and its dump does not come (the others' do)."""
    folder = str(tmp_path / "dumps")
    os.makedirs(folder)
    env = {"TORCH_FR_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": os.path.join(folder, "rank_"),
           "FAIRRING_STATUS": "off"}
    res = launch.run_ranks(rfr.broken, node_ids("1x3"), args=("stall", 2, folder, 12.0), timeout_s=120,
                           pg_timeout_s=5, env=env)
    assert [r.value["dumped"] for r in res] == [True, True, False], [r.value for r in res]


@pytest.mark.parametrize("buffer", [4, 0], ids=["torch-keeps-4", "torch-off"])
def test_recent_ops_read_their_states_from_torchs_recorder(buffer):
    """One record per op: where torch's recorder is on, dump_recent's states
    and times are read from its entries, so the ops it no longer holds (a
    ring of 4 here) show as "unknown", their own fields (kind, number,
    description, bytes) kept; with torch's recorder off, Fairring's ring
    keeps all of it.  A failed op shows its error and duration either way."""
    res = launch.run_ranks(rfr.recent_view, node_ids("1x3"), timeout_s=120, pg_timeout_s=30,
                           env={"TORCH_FR_BUFFER_SIZE": str(buffer)})
    for r in res:
        v = r.value
        assert v["error"] and "mismatch" in v["error"], f"rank {r.rank}: {v['error']}"
        recs = v["recent"]
        assert [x["kind"] for x in recs] == ["all_reduce"] * 11, recs
        assert [x["seq"] for x in recs] == list(range(11)), recs
        assert [x["bytes"] for x in recs[:10]] == [4 * (1 + i) for i in range(10)], recs
        assert recs[9]["what"] == "10 elements of float32 with SUM", recs[9]
        last = recs[-1]
        assert last["state"] == "failed" and "mismatch" in last["error"], last
        assert last["duration_ms"] is not None and last["started_ms_ago"] is not None, last
        kept = 10 if buffer == 0 else buffer - 1  # torch's ring: the last `buffer` ops, the failed one among them
        for x in recs[:10 - kept]:
            assert x["state"] == "unknown" and x["started_ms_ago"] is None and x["duration_ms"] is None, x
        for x in recs[10 - kept:10]:
            assert x["state"] == "done" and x["duration_ms"] is not None and x["duration_ms"] >= 0, x
        assert "#0 all_reduce of 1 elements of float32 with SUM, 4 bytes: " + recs[0]["state"] in v["printed"]
        # After another group's ops: torch's ring no longer has the failed op
        # (so no start, no duration), Fairring still knows it failed and why.
        later = v["failed_later"]
        assert later["seq"] == 10 and later["state"] == "failed" and "mismatch" in later["error"], later
        assert (later["duration_ms"] is None) == bool(buffer), later
        if buffer:
            # What dump_recent shows is what torch's entries say (a failed op: retired, not completed).
            assert v["torch"] == [(8, "completed", True), (9, "completed", True), (10, "completed", True),
                                  (11, "started", True)], v["torch"]
        else:
            assert v["torch"] == [], v["torch"]
