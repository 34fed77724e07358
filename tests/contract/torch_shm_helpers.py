"""A real two-rank ``torch.distributed`` job, and what the release tests need around it.

Used by ``tests/contract/test_torch_distributed_shm.py`` (gloo on CPU, CI) and ``tests/gpu/multi_gpu_release.py``
(NCCL on two GPUs). The module imports only the standard library; torch is imported inside the job, which runs
under whichever interpreter has torch (the CPU contract venv, or the GPU host's python):

    python torch_shm_helpers.py job CONFIG_JSON

starts a launcher that spawns ``world`` ranks with ``torch.multiprocessing`` (start method ``spawn``) and waits
for them without ever signalling one (a launcher that does not tear its job down, so a rank whose peer died
stays behind, as after an OOM kill or a crashed supervisor). Each rank:

* sets its process title the way SGLang's scheduler does (``setproctitle``, or where that package is missing
  the same effect by hand: argv area rewritten, ``comm`` set with ``prctl(PR_SET_NAME)``);
* joins the process group (``backend``), allocates ``mib`` MiB on its device (``cuda:<rank>`` or CPU);
* creates ``psm_*`` with ``multiprocessing.shared_memory`` and keeps it open and mapped, and shares a tensor
  with torch's ``file_system`` strategy, which leaves ``/dev/shm/torch_*`` only mapped (its fd is closed);
* runs ``all_reduce`` in a loop and writes a heartbeat (iteration count) to ``<workdir>/hb-<rank>`` after
  each completed one. When a collective fails (gloo notices a dead peer; NCCL usually just blocks) it writes
  the error to the heartbeat file and keeps holding everything, like a rank that outlived its peer.

The ``psm_*`` segments are taken away from the multiprocessing resource tracker (what ``track=False`` does on
Python 3.13): the tracker would otherwise unlink them when the launcher exits, and these tests are about
what a job leaves behind when nothing cleans up after it.

Test-side helpers (project venv): ``Job`` (start, wait ready, heartbeats), ``shm_use`` (who has an entry open
or mapped), ``run_teardown`` (``playbooks/teardown.yml`` through ``ansible-playbook`` on localhost, local
connection, every task result captured by a small callback, ansible-core only) and the private namespace
re-exec (``unshare --mount --pid --fork --mount-proc`` with a private tmpfs on ``/dev/shm``).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
PRIVATE_SHM_SOURCE = "bws-test-shm"
INSIDE_ENV = "BWS_PRIVATE_NS"
READY_TIMEOUT_S = 240.0
_PR_SET_NAME = 15
_HOLD: list[Any] = []  # what a rank keeps alive (tensors, segments)


# ---------------------------------------------------------------- process title


def set_process_title(title: str) -> str:
    """Give this process ``title`` as SGLang does (setproctitle); returns which way it was done."""
    try:
        import setproctitle  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        setproctitle.setproctitle(title)
        return "setproctitle"
    # setproctitle on Linux: overwrite the argv area (so /proc/<pid>/cmdline reads the title followed by
    # NULs) and set comm. arg_start and arg_end are fields 48 and 49 of /proc/self/stat (Linux >= 3.5).
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rpartition(b")")[2].split()
    arg_start, arg_end = int(fields[45]), int(fields[46])
    size = arg_end - arg_start
    raw = title.encode()[: size - 1]
    ctypes.memmove(arg_start, raw + b"\0" * (size - len(raw)), size)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    return "argv area + prctl(PR_SET_NAME)"


# ---------------------------------------------------------------- the job (runs where torch is)


def _write_atomically(path: Path, text: str) -> None:
    # write_text truncates first: a reader between truncate and write would see "" (a heartbeat that seems
    # to have stopped, or moved, when it did neither).
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _write_json(path: Path, data: Any) -> None:
    _write_atomically(path, json.dumps(data))


def _psm_segment(name: str) -> Any:
    from multiprocessing import resource_tracker, shared_memory

    shm = shared_memory.SharedMemory(name=name, create=True, size=1 << 20)
    shm.buf[:5] = b"hello"
    resource_tracker.unregister(shm._name, "shared_memory")  # see the module docstring
    return shm


def _torch_file_system_tensor(torch: Any) -> str:
    """A tensor shared with the ``file_system`` strategy; returns its /dev/shm name."""
    before = set(os.listdir("/dev/shm"))
    tensor = torch.ones(1 << 18)  # 1 MiB
    tensor.share_memory_()
    _HOLD.append(tensor)
    created = sorted(set(os.listdir("/dev/shm")) - before)
    new = [n for n in created if n.startswith(f"torch_{os.getpid()}_")]  # torch_<pid>_<random>_<n>
    if len(new) != 1:
        raise RuntimeError(f"expected one new torch_* entry in /dev/shm, found {created}")
    return new[0]


def rank_main(rank: int, cfg: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as tmp

    title_how = set_process_title(cfg["titles"][rank])
    tmp.set_sharing_strategy("file_system")
    work = Path(cfg["workdir"])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg["port"]))
    device = torch.device(f"cuda:{rank}") if cfg["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # A long collective timeout: the surviving rank must stay stuck for the test, not be timed out by torch.
    timeout = datetime.timedelta(seconds=cfg.get("collective_timeout_s", 1800))
    dist.init_process_group(cfg["backend"], rank=rank, world_size=cfg["world"], timeout=timeout)
    if cfg.get("mib"):
        _HOLD.append(torch.empty(int(cfg["mib"]) << 20, dtype=torch.uint8, device=device))
    shm = _psm_segment(f"psm_bws_r{rank}_{os.getpid()}")
    _HOLD.append(shm)
    torch_entry = _torch_file_system_tensor(torch)
    x = torch.ones(1024, device=device)
    dist.all_reduce(x)  # the first collective brings up the communicator (NCCL: its /dev/shm segments)
    if device.type == "cuda":
        torch.cuda.synchronize()
    ready = {
        "rank": rank,
        "pid": os.getpid(),
        "title": cfg["titles"][rank],
        "title_set_by": title_how,
        "device": str(device),
        "psm": shm._name.lstrip("/"),
        "torch_entry": torch_entry,
        "shm_after_init": sorted(os.listdir("/dev/shm")),
    }
    _write_json(work / f"ready-{rank}.json", ready)
    heartbeat = work / f"hb-{rank}"
    count = 0
    try:
        while True:
            dist.all_reduce(x)
            if device.type == "cuda":
                torch.cuda.synchronize()  # waits for the collective itself, not only its launch
            count += 1
            _write_atomically(heartbeat, str(count))
            time.sleep(cfg.get("interval_s", 0.01))
    except Exception as exc:
        _write_atomically(heartbeat, f"{count} error: {type(exc).__name__}: {str(exc)[:300]}")
    while True:  # a rank that outlived its peer: holds its memory and segments until it is killed
        time.sleep(3600)


def launch(cfg: dict[str, Any]) -> None:
    import torch.multiprocessing as tmp

    context = tmp.start_processes(rank_main, args=(cfg,), nprocs=cfg["world"], join=False, start_method="spawn")
    _write_json(Path(cfg["workdir"]) / "launcher.json", {"pid": os.getpid(), "ranks": context.pids()})
    for proc in context.processes:
        proc.join()


# ---------------------------------------------------------------- test side: the job


def heartbeat(work: Path, rank: int) -> str:
    try:
        return (work / f"hb-{rank}").read_text()
    except FileNotFoundError:
        return ""


class Job:
    """The launcher and its ranks, started with ``python`` (an interpreter with torch)."""

    def __init__(self, python: str, work: Path, env: dict[str, str] | None = None, **cfg: Any) -> None:
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.cfg = {"workdir": str(work), "world": 2, **cfg}
        self.log = (work / "job.log").open("wb")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "job", json.dumps(self.cfg)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.ranks: list[dict[str, Any]] = []

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        files = [self.work / f"ready-{r}.json" for r in range(self.cfg["world"])]
        while not all(f.exists() for f in files):
            if self.proc.poll() is not None:
                raise AssertionError(f"the job exited (rc {self.proc.returncode}) before it was ready:\n{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the job was not ready after {timeout} s:\n{self.tail()}")
            time.sleep(0.05)
        self.ranks = [json.loads(f.read_text()) for f in files]
        self.wait_heartbeats_advance()
        return self.ranks

    def wait_heartbeats_advance(self, ranks: list[int] | None = None, timeout: float = 30.0) -> None:
        """Each rank of ``ranks`` (default: every rank) completes collectives: its heartbeat moves."""
        ranks = list(range(self.cfg["world"])) if ranks is None else ranks
        start = {r: heartbeat(self.work, r) for r in ranks}
        deadline = time.monotonic() + timeout
        while any(heartbeat(self.work, r) == start[r] for r in ranks):
            if time.monotonic() > deadline:
                raise AssertionError(f"collectives do not complete: heartbeats stuck at {start}\n{self.tail()}")
            time.sleep(0.01)

    def launcher_pid(self) -> int:
        return self.proc.pid

    def pids(self) -> list[int]:
        return [self.proc.pid, *(r["pid"] for r in self.ranks)]

    def tail(self, chars: int = 3000) -> str:
        self.log.flush()
        return (self.work / "job.log").read_bytes()[-chars:].decode(errors="replace")

    def stop(self) -> None:
        """Test clean-up: SIGKILL whatever of the job is left (only PIDs this job started)."""
        for pid in [r["pid"] for r in self.ranks if alive(r["pid"])]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.log.close()


def alive(pid: int) -> bool:
    """Exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """PIDs still alive after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def wait_stalled(work: Path, rank: int, quiet_s: float, timeout: float = 30.0) -> dict[str, Any]:
    """Wait until rank's heartbeat has not moved for ``quiet_s`` seconds; returns what it last said."""
    deadline = time.monotonic() + timeout
    last, since = heartbeat(work, rank), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise AssertionError(f"rank {rank} heartbeat still advancing after {timeout} s ({last!r})")
        time.sleep(0.02)
        now = heartbeat(work, rank)
        if now != last:
            last, since = now, time.monotonic()
    count, _, error = last.partition(" error: ")
    return {"heartbeat": int(count or 0), "error": error or None, "quiet_s": quiet_s}


def shm_use(shm_dir: str = "/dev/shm") -> dict[str, dict[str, list[int]]]:
    """name -> {"open": PIDs with an fd on it, "mapped": PIDs with it in /proc/<pid>/maps}, from /proc."""
    prefix = shm_dir.rstrip("/") + "/"
    use: dict[str, dict[str, list[int]]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}").removesuffix(" (deleted)")
                    if target.startswith(prefix):
                        use.setdefault(target[len(prefix) :], {"open": [], "mapped": []})["open"].append(pid)
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            rows = (line.split(None, 5) for line in f)
            mapped = {r[5].strip().removesuffix(" (deleted)") for r in rows if len(r) == 6}
            for path in mapped:
                if path.startswith(prefix):
                    entry = use.setdefault(path[len(prefix) :], {"open": [], "mapped": []})
                    if pid not in entry["mapped"]:
                        entry["mapped"].append(pid)
    return {k: {kind: sorted(set(v)) for kind, v in e.items()} for k, e in use.items()}


# ---------------------------------------------------------------- test side: teardown.yml

def run_teardown(work: Path, extravars: dict[str, Any], python: str = sys.executable) -> dict[str, Any]:
    """Run playbooks/teardown.yml on localhost (local connection, ``python`` as the interpreter) through
    tests/playbook_run.py.

    Returns {"rc", "wall_s", "release": the gpu_release task result, "summary": the teardown summary lines,
    "run": the PlaybookRun, "output": the end of ansible-playbook's output}.
    """
    from tests.playbook_run import local_inventory, run_playbook  # the test side only: the job side has no runner

    work.mkdir(parents=True, exist_ok=True)
    inventory = local_inventory(work / f"hosts-{len(list(work.glob('hosts-*')))}.json", python=python)
    t0 = time.monotonic()
    # nobody is at ansible-runner's terminal: teardown.yml refuses unless told ahead
    run = run_playbook("playbooks/teardown.yml", inventory, extravars={"teardown_confirm": "yes", **extravars},
                       workdir=work, timeout=600,
                       envvars={"ANSIBLE_LOCAL_TEMP": str(work / "tmp")})
    wall = round(time.monotonic() - t0, 3)
    release = next((event["event_data"].get("res") for event in run.task_events
                    if event["event_data"].get("task_action") in ("blackwell.serving.gpu_release", "gpu_release")),
                   None)
    summary = next((result.get("msg") for result in run.results("Teardown | summary")), None)
    return {"rc": run.rc, "wall_s": wall, "release": release, "summary": summary, "run": run,
            "output": run.stdout[-6000:]}


# ---------------------------------------------------------------- private namespace


def private_shm_mounted() -> bool:
    """/dev/shm is the private tmpfs this file mounts (never the host's)."""
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        mounts = [line.split() for line in f]
    shm = [m for m in mounts if m[4] == "/dev/shm"]
    if not shm:
        return False
    last = shm[-1]  # the top mount on /dev/shm
    return last[last.index("-") + 2] == PRIVATE_SHM_SOURCE


def private_namespace_argv(argv: list[str], shm_size: str = "512m") -> list[str]:
    """argv run in new PID and mount namespaces (fresh /proc) with a private tmpfs on /dev/shm."""
    mount = f'mount -t tmpfs -o size={shm_size},mode=1777 {PRIVATE_SHM_SOURCE} /dev/shm && exec "$@"'
    return [
        "unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc",
        "sh", "-c", mount, "sh", *argv,
    ]  # fmt: skip


def private_namespace_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (unshare --pid --mount and a tmpfs mount)"
    if shutil.which("unshare") is None:
        return "unshare(1) not found"
    return None


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "job":
        sys.exit("usage: torch_shm_helpers.py job CONFIG_JSON")
    launch(json.loads(sys.argv[2]))
