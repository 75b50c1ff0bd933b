"""Reduction servers for tests: `python -m fairring_py.server` processes
started next to a run_ranks job (they join through its store at
127.0.0.1:port, waiting for it to come up), with their output captured."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time


class Servers:
    def __init__(self, port: int, count: int, extra_args=(), env=None):
        self.port = port
        self.procs = []
        self.logs = []
        child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        child_env.pop("FAIRRING_SOCKET_IFNAME", None)
        child_env.update(env or {})
        for _ in range(count):
            log = tempfile.NamedTemporaryFile(prefix="fairring-server-", suffix=".log", delete=False)
            self.logs.append(log.name)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "fairring_py.server", "--store", f"127.0.0.1:{port}", "--connect-timeout",
                 "60", *extra_args],
                stdout=log, stderr=subprocess.STDOUT, env=child_env))
            log.close()

    @property
    def pids(self):
        return [p.pid for p in self.procs]

    def output(self, i: int) -> str:
        with open(self.logs[i], errors="replace") as f:
            return f.read()

    def outputs(self) -> str:
        return "\n".join(f"--- server process {i}:\n{self.output(i)}" for i in range(len(self.procs)))

    def wait_exit(self, timeout_s: float):
        """Exit codes once every server that joined the job has exited, or
        None for those that did not within timeout_s.  (Called once the job
        has ended: a server that has not joined by then never will.)"""
        deadline = time.monotonic() + timeout_s
        for i, p in enumerate(self.procs):
            if "listening on" not in self.output(i):
                continue
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        return [p.poll() for p in self.procs]

    def served(self):
        """Reductions each server reported at exit, by the index it had in
        the job (from its log)."""
        out = {}
        for i in range(len(self.procs)):
            m = re.search(r"fairring server (\d+): exiting: .*served (\d+) reductions", self.output(i))
            if m:
                out[int(m.group(1))] = int(m.group(2))
        return out

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for path in self.logs:
            try:
                os.unlink(path)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
