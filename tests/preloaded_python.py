"""``python -c SCRIPT ARGS...`` for the tests' engine ranks and tracking writers, without paying the imports each
time: the ranks are forked from a server process that imported torch, transformers' BERT,
DeepSpeed and vlp's engine once (multiprocessing's forkserver with those modules preloaded).

A rank started with ``sys.executable -c`` spends ~6 CPU seconds importing before it runs a
step; the suite starts dozens (one-rank engines, 2- and 4-rank gloo groups), so on a 2-core
machine those imports were ~7% of ``make test``'s CPU. A forked rank is still its own
process: its own interpreter state after the fork, its own gloo process group, its own
``__main__``, the environment and working folder it is given; what it shares with the
others is read-only memory of the modules imported before the fork.

What is decided at import time is decided in the server, once, from the environment the
test process had when the server started: DeepSpeed's accelerator (CPU) and torch's kernel
set (``ATEN_CPU_CAPABILITY``). A test that changes those runs its script with
``subprocess`` instead (``test_cpu_precision.py`` does).
"""

from __future__ import annotations

import faulthandler
import io
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass

# what the tests' scripts import: an engine rank (torch, BERT, DeepSpeed, the engine and the
# loop) and a tracking writer (MLflow's client, rank zero's tracker)
PRELOAD = ["torch", "torch.distributed", "transformers.models.bert.modeling_bert",
           "vlp.platform.training.deepspeed_import", "vlp.platform.training.engine",
           "vlp.platform.training.loop", "mlflow", "vlp.platform.tracking.rank_zero",
           "vlp.platform.training.checkpointing"]

_context = None
STACKS_SIGNAL = signal.SIGUSR1       # a rank writes its Python stacks to its stderr on it


@dataclass
class Finished:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would have returned."""

    returncode: int
    stdout: str
    stderr: str


def _forkserver():
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def _main(script: str, argv: list[str], env: dict[str, str], cwd: str | None,
          out_path: str, err_path: str) -> None:
    """The child: stdout and stderr to files (fds 1 and 2, so C code's writes land there
    too), the given environment and folder, then ``script`` as ``__main__``."""
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=False)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
    faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)   # see run_python
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    sys.argv = ["-c", *argv]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(script, "<string>", "exec"), main.__dict__)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    sys.exit(code)


def run_python(script: str, argvs: list[list[str]], *, env: dict[str, str] | None = None,
               cwd=None, timeout: float = 300) -> list[Finished]:
    """Run ``script`` once per entry of ``argvs`` (``sys.argv[1:]``), all at once (the
    ranks of one group meet each other), and wait for every one; past ``timeout`` seconds
    all are killed and ``TimeoutError`` names the ones still running and holds every rank's
    exit code and the end of its stderr (a rank still running first writes its threads'
    Python stacks there: where it waits)."""
    ctx = _forkserver()
    env = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="vlp-rank-") as tmp:
        procs = []
        for i, argv in enumerate(argvs):
            out, err = os.path.join(tmp, f"{i}.out"), os.path.join(tmp, f"{i}.err")
            p = ctx.Process(target=_main, args=(script, [str(a) for a in argv], env,
                                                None if cwd is None else str(cwd), out, err))
            p.start()
            procs.append((p, out, err))
        deadline = time.monotonic() + timeout
        for p, _, _ in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [i for i, (p, _, _) in enumerate(procs) if p.is_alive()]
        if alive:
            for i in alive:
                os.kill(procs[i][0].pid, STACKS_SIGNAL)
            time.sleep(2)
            for p, _, _ in procs:
                if p.is_alive():
                    p.kill()
                p.join(10)
            raise TimeoutError(f"ranks {alive} of {len(procs)} still running after {timeout} s"
                               + "".join(_stderr_end(i, p.exitcode, i in alive, err)
                                         for i, (p, _, err) in enumerate(procs)))
        return [Finished(p.exitcode, _read(out), _read(err)) for p, out, err in procs]


def _stderr_end(rank: int, exitcode: int | None, was_alive: bool, path: str) -> str:
    state = "was still running" if was_alive else f"exit code {exitcode}"
    return f"\n--- rank {rank} ({state}), the end of its stderr:\n{_read(path)[-2500:]}"


def _read(path: str) -> str:
    """The file, or, when the rank died before it opened it, a line that says so."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return "(no output: the process died before it ran the script; see the test's log)"


def fresh_python(code: str, *, cwd=None, env: dict[str, str] | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -c code`` in a new interpreter, its output captured as text."""
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
