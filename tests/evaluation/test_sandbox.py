"""The sandbox holds: every escape a program tries is contained (nothing written, nothing
reached, nothing left running), the item fails, and the run ends within its limits.

These tests need bubblewrap and fail without it: scripts/setup.sh installs it.
"""
import os
import shutil
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import quantkit
from quantkit.evaluation import sandbox
from quantkit.evaluation.code_exec import run_program
from quantkit.evaluation.sandbox import Limits, SandboxUnavailable, find_sandbox

REPO_FILE = Path(quantkit.__file__)


@pytest.fixture(scope="module")
def sb():
    return find_sandbox()


@pytest.fixture
def outside():
    """A host folder outside /tmp (the sandbox's /tmp is its own) that anyone may write to, as
    /var/tmp and /dev/shm are: only the mounts stand between it and the program."""
    d = Path(tempfile.mkdtemp(prefix="quantkit-outside-", dir="/var/tmp"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d)


def procs_with(token: str) -> list[int]:
    found = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and token in (p / "cmdline").read_bytes().decode("utf-8", "replace"):
                found.append(int(p.name))
        except OSError:
            pass
    return found


def test_bubblewrap_is_installed():
    assert shutil.which("bwrap"), "bubblewrap is missing: run scripts/setup.sh (it installs it)"


def test_identity_view_and_limits_inside(sb, tmp_path):
    lim = Limits(wall_s=5.0, mem_bytes=700 * 2**20, procs=17, file_bytes=3 * 2**20, open_files=33)
    uid = sandbox.NOBODY if os.geteuid() == 0 else os.getuid()
    src = f"""
import os, resource, socket
assert os.getuid() == {uid} and os.getgid() == {sandbox.NOBODY if os.geteuid() == 0 else os.getgid()}, os.getuid()
assert os.getgroups() in ([], [os.getgid()]), os.getgroups()
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0, status["CapBnd"]
assert status["NoNewPrivs"].strip() == "1"
assert [n for _, n in socket.if_nameindex()] == ["lo"]
for path in ({str(REPO_FILE)!r}, {str(tmp_path)!r}, "/home", "/etc/passwd"):
    assert not os.path.exists(path), path
assert resource.getrlimit(resource.RLIMIT_AS)[1] == {lim.mem_bytes}
assert resource.getrlimit(resource.RLIMIT_NPROC)[1] == 17
assert resource.getrlimit(resource.RLIMIT_FSIZE)[1] == {lim.file_bytes}
assert resource.getrlimit(resource.RLIMIT_NOFILE)[1] == 33
assert resource.getrlimit(resource.RLIMIT_CPU)[1] == {lim.cpu_s}
assert os.getcwd() == "/tmp" and set(os.environ) <= {{"PATH", "PWD", "LC_CTYPE"}}, dict(os.environ)
assert len([p for p in os.listdir("/proc") if p.isdigit()]) <= 3 and os.getpid() < 10   # its own pid namespace
"""
    out = sb.run(src, lim)
    assert out.returncode == 0, out.stderr_tail


def test_posix_system_writes_nothing_outside(sb, outside, tmp_path):
    targets = [outside / "pwned", tmp_path / "pwned"]
    cmd = "; ".join(f"echo x > {t}" for t in targets)
    r = run_program(f"import posix\nassert posix.system({cmd!r}) == 0\n", sb)
    assert not r.passed and "AssertionError" in r.stderr_tail
    assert not any(t.exists() for t in targets)


def test_subprocess_writes_nothing_outside(sb, outside):
    r = run_program("import subprocess\n"
                    f"subprocess.run(['/bin/sh', '-c', 'echo x > {outside}/pwned'], check=True)\n", sb)
    assert not r.passed and "CalledProcessError" in r.stderr_tail
    assert not (outside / "pwned").exists()


def test_open_for_writing_outside_the_temp_folder_fails(sb, outside, tmp_path):
    before = REPO_FILE.read_bytes(), REPO_FILE.stat().st_mtime_ns
    for target, mode in ((outside / "f", "w"), (tmp_path / "f", "w"), (REPO_FILE, "a"), (Path("/usr/f"), "w"),
                         (Path("/f"), "w")):
        r = run_program(f"open({str(target)!r}, {mode!r}).write('x')\n", sb)
        assert not r.passed and "Error" in r.stderr_tail, target
    assert not (outside / "f").exists() and not (tmp_path / "f").exists() and not Path("/usr/f").exists()
    assert (REPO_FILE.read_bytes(), REPO_FILE.stat().st_mtime_ns) == before
    # its own /tmp is writable, and private: nothing of it reaches the host's /tmp
    name = f"quantkit-probe-{uuid.uuid4().hex}"
    assert run_program(f"open('/tmp/{name}', 'w').write('x')\nassert open('/tmp/{name}').read() == 'x'\n", sb).passed
    assert not Path("/tmp", name).exists()


def test_no_connection_reaches_a_local_listener(sb):
    tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen(4)
        udp.bind(("127.0.0.1", 0))
        for s in (tcp, udp):
            s.settimeout(0.3)
        tp, up = tcp.getsockname()[1], udp.getsockname()[1]
        for src in (f"import socket\nsocket.create_connection(('127.0.0.1', {tp}), timeout=2)\n",
                    f"import _socket\ns = _socket.socket()\ns.settimeout(2)\ns.connect(('127.0.0.1', {tp}))\n",
                    f"import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', {up}))\n"
                    "import time; time.sleep(0.2)\nassert False, 'sent'\n"):
            r = run_program(src, sb, timeout_s=5)
            assert not r.passed, src
        with pytest.raises(socket.timeout):
            tcp.accept()
        with pytest.raises(socket.timeout):
            udp.recvfrom(16)
    finally:
        tcp.close()
        udp.close()


def test_fork_loop_is_capped_and_its_processes_die(sb):
    token = f"4{uuid.uuid4().int % 10**8}.5"   # a sleep length no other process has
    lim = Limits(wall_s=3.0, procs=16)
    src = f"""
import os, sys
n = 0
try:
    while True:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "{token}"])
        n += 1
except OSError as e:
    sys.stderr.write(f"forked {{n}}: {{type(e).__name__}}\\n")
    raise
"""
    t = time.perf_counter()
    out = sb.run(src, lim)
    assert time.perf_counter() - t < lim.wall_s + 2
    assert out.returncode not in (0, None) and "BlockingIOError" in out.stderr_tail, out
    forked = int(out.stderr_tail.split("forked ")[1].split(":")[0])
    assert 0 < forked < lim.procs
    time.sleep(0.2)
    assert procs_with(token) == []


def test_a_fork_loop_that_never_ends_is_killed_whole_at_the_wall_clock(sb):
    token = f"5{uuid.uuid4().int % 10**8}.5"
    src = f"""
import os
while True:
    try:
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sleep", ["sleep", "{token}"])
    except OSError:
        pass
"""
    t = time.perf_counter()
    r = run_program(src, sb, timeout_s=1.5)
    assert r.status == "timeout" and time.perf_counter() - t < 4
    time.sleep(0.2)
    assert procs_with(token) == []


def test_children_do_not_outlive_a_program_that_passes(sb):
    token = f"6{uuid.uuid4().int % 10**8}.5"
    r = run_program(f"import os\nif os.fork() == 0:\n    os.setsid()\n    os.execv('/bin/sleep', ['sleep', '{token}'])\n",
                    sb)
    assert r.passed
    time.sleep(0.2)
    assert procs_with(token) == []


@pytest.mark.parametrize("src", ["x = bytearray(3 * 2**30)\n",
                                 "chunks = []\nwhile True:\n    chunks.append(bytearray(2**24))\n"])
def test_memory_bomb_fails_inside(sb, src):
    t = time.perf_counter()
    r = run_program(src, sb, mem_bytes=512 * 2**20)
    assert not r.passed and "MemoryError" in r.stderr_tail
    assert time.perf_counter() - t < 4


def test_endless_loop_times_out(sb):
    t = time.perf_counter()
    r = run_program("while True:\n    pass\n", sb, timeout_s=1.0)
    assert r.status == "timeout" and time.perf_counter() - t < 3


def test_file_size_and_stderr_are_capped(sb):
    r = run_program("open('/tmp/big', 'wb').write(b'x' * 8 * 2**20)\n", sb)
    assert not r.passed and "File too large" in r.stderr_tail
    t = time.perf_counter()
    r = run_program("import sys\nwhile True:\n    sys.stderr.write('x' * 65536)\n", sb, timeout_s=3)
    assert not r.passed and len(r.stderr_tail) <= 400 and time.perf_counter() - t < 5


def test_absent_or_broken_bubblewrap_is_reported(monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP", "quantkit-no-such-bwrap")
    with pytest.raises(SandboxUnavailable, match="bubblewrap .bwrap. is not installed"):
        find_sandbox()
    with pytest.raises(SandboxUnavailable, match="code cannot run: bubblewrap.*--unsafe-code-exec"):
        run_program("pass\n")           # no runner given and none can be set up: never unsandboxed
    monkeypatch.setattr(sandbox, "BWRAP", "false")
    with pytest.raises(SandboxUnavailable, match="failed its probe"):
        find_sandbox()


def test_the_unsafe_runner_runs_without_the_boundary(tmp_path):
    runner = sandbox.code_runner(unsafe=True)
    assert not runner.sandboxed
    target = tmp_path / "written"
    assert run_program(f"open({str(target)!r}, 'w').write('x')\n", runner).passed
    assert target.read_text() == "x"
    assert run_program("while True:\n    pass\n", runner, timeout_s=1.0).status == "timeout"
