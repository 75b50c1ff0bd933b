"""torch's flight-recorder analyzer on the dumps of a Fairring job.

    python -m fairring_py.fr_trace DIR [options of torch's fr_trace]

Every rank of a Fairring job records its ops into torch's flight recorder and,
with TORCH_FR_DUMP_ON_TIMEOUT=1, dumps it when its group fails (to
$TORCH_FR_DUMP_TEMP_FILE<rank>; docs/USER_GUIDE.md, "Reading a hang").  torch's
analyzer (python -m torch.distributed.flight_recorder.fr_trace) reads such a
folder and names the first collective the ranks disagree on, but it knows an
op only by a library it lists ("nccl:all_reduce", "gloo:broadcast"), and
Fairring's entries say "fairring:all_reduce".  This copies the dumps into a
temporary folder with Fairring's ops under gloo's prefix (Fairring's CPU
collectives have gloo's names and meanings), runs torch's analyzer on the copy
with the options given, and exits with its status.  The dumps themselves are
left as they are.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from typing import List

USAGE = "usage: python -m fairring_py.fr_trace DIR [options of torch's fr_trace]"
PREFIX = "fairring:"
READ_AS = "gloo:"
# Fairring's name -> the analyzer's, where they differ.
NAMES = {"all_reduce_coalesced": "allreduce_coalesced"}


def translate_entry_name(name: str) -> str:
    """'fairring:send 0->1' -> 'gloo:send 0->1'; other names unchanged."""
    if not name.startswith(PREFIX):
        return name
    op, sep, detail = name[len(PREFIX):].partition(" ")
    return READ_AS + NAMES.get(op, op) + sep + detail


def translate_dir(src: str, dst: str) -> List[str]:
    """Copies every dump in ``src`` into ``dst``, Fairring's op names
    translated.  Returns the files copied."""
    done = []
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            try:
                dump = pickle.load(f)
            except Exception as e:  # noqa: BLE001  (not a dump: say which)
                raise SystemExit(f"fairring_py.fr_trace: {path} is not a flight-recorder dump ({e})") from e
        for entry in dump.get("entries", []):
            entry["profiling_name"] = translate_entry_name(entry.get("profiling_name", ""))
        with open(os.path.join(dst, name), "wb") as f:
            pickle.dump(dump, f)
        done.append(name)
    return done


def main(argv: List[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    src, rest = argv[0], argv[1:]
    if not os.path.isdir(src):
        print(f"fairring_py.fr_trace: {src} is not a folder of dumps", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fairring-fr-") as tmp:
        if not translate_dir(src, tmp):
            print(f"fairring_py.fr_trace: no dumps in {src}", file=sys.stderr)
            return 2
        cmd = [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", tmp, *rest]
        return subprocess.call(cmd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
