"""Starting torchrun for ``convert --nproc N`` and making sure none of its processes outlive the
command.

torchrun's agent starts each rank in a session of its own, so signalling the agent's process
group does not reach the ranks: ``stop_tree`` walks the agent's descendants instead, and does
so until none is left (ranks may still be starting when it begins). A command killed with
SIGKILL cannot clean up at all; there the kernel does: the agent is started with a parent-death
signal (``die_with_parent``), which it forwards to its ranks, and each rank sets one too
(``quantkit.common.distributed.initialize``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quantkit.common.distributed import free_port, launch_argv
from quantkit.common.process import die_with_parent
import psutil
from quantkit.formats import staging

#: Seconds the processes get between SIGTERM (rank 0 removes its staging folder) and SIGKILL.
STOP_GRACE_SECONDS = 5.0


def stop_tree(pid: int, grace: float = STOP_GRACE_SECONDS) -> None:
    """Stop process ``pid`` and every process it started, however deep: SIGTERM, up to ``grace``
    seconds to exit, then SIGKILL. Returns when none of them is left."""

    try:
        root = [psutil.Process(pid)]
    except psutil.NoSuchProcess:
        root = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        seen: dict[int, psutil.Process] = {}
        for _ in range(50):   # processes may start while this runs: look again until none is new
            procs = [p for p in root if p.is_running()]
            for p in list(procs):
                try:
                    procs += p.children(recursive=True)
                except psutil.NoSuchProcess:
                    pass
            new = [p for p in procs if p.pid not in seen]
            if not new:
                break
            for p in new:
                seen[p.pid] = p
                try:
                    p.send_signal(sig)
                    if sig == signal.SIGTERM:
                        p.resume()   # a stopped (Ctrl-Z) process acts on SIGTERM only once continued
                except psutil.NoSuchProcess:
                    pass
        _, alive = psutil.wait_procs(list(seen.values()), timeout=grace if sig == signal.SIGTERM else 10)
        if not alive:
            return
        root = alive


def run_ranks(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv`` (torchrun) in a session of its own and return its exit status; on every way
    out (its end, an exception, KeyboardInterrupt or SIGTERM turned into one) its whole process
    tree is stopped first."""
    parent = os.getpid()
    proc = subprocess.Popen(argv, env=env, start_new_session=True,
                            preexec_fn=lambda: die_with_parent(parent))
    try:
        return proc.wait()
    finally:
        # a second Ctrl-C or SIGTERM must not cut the stop short and leave ranks behind
        try:
            previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        except ValueError:   # not the main thread: signals are not ours to change
            previous = {}
        try:
            stop_tree(proc.pid)
            proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def remove_dead_staging(out: Path, since: float) -> list[Path]:
    """Staging folders for ``out`` whose owner is gone (a rank stopped before it cleaned up):
    removed, since a data-parallel run is never resumed. A rank stopped half-way through its own
    clean-up can leave a folder whose owner record is already gone (the name still gives the dead
    pid): such a folder is the run's when it was made after the run started (``since``, a
    ``time.time()``). Returns them."""

    target = str(Path(out).resolve())
    removed = []
    for folder, owner in staging.dead_folders(Path(out).resolve().parent):
        ours = owner.out == target or (owner.out is None and _made_since(folder, since))
        if ours:
            staging.remove(folder)
            removed.append(folder)
    return removed


def _made_since(folder: Path, since: float) -> bool:
    try:
        return folder.stat().st_ctime >= since - 1.0   # file-system time stamps are coarse
    except OSError:
        return False


def relaunch_on_ranks(nproc: int, args: list[str], out: Path) -> int:
    """Run ``quantkit ARGS`` under torchrun on ``nproc`` local ranks; its exit status.

    No process of the run outlives this one (``run_ranks``), and no staging folder for ``out``
    that a stopped rank left behind."""

    # torchrun's logs and the ranks' temporary files (a rank other than 0 records its layers in a
    # private folder) live in one folder of the run's, removed however the run ends: a rank
    # stopped before it cleaned up leaves nothing in the user's temporary folder
    started = time.time()
    run = Path(tempfile.mkdtemp(prefix="quantkit-torchrun-"))
    (run / "logs").mkdir()
    (run / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(run / "tmp"))
    env.setdefault("OMP_NUM_THREADS", "1")   # torchrun's own default for several ranks, without its warning
    try:
        return run_ranks([sys.executable, *launch_argv(nproc, args, free_port(), str(run / "logs"))], env)
    finally:
        remove_dead_staging(out, started)
        shutil.rmtree(run, ignore_errors=True)
