"""The ENGINE TEST DOUBLE compiles on first use, as the engines do: with an empty kernel cache, a silent build by the
compiler TEST DOUBLE (a process named cicc) before /health answers (ENGINE_DOUBLE_COMPILE_START_S) and at the first
sampled request (ENGINE_DOUBLE_COMPILE_SAMPLED_S; greedy requests never build); a warm cache builds nothing; the faults
compile-stall (the compiler lives, idle) and hang-after-compile. Unset, nothing is built.

Each case runs in a PID namespace of its own (unshare --pid --fork --mount-proc, as root): the double and its compiler
end with the namespace, and no process outside it is ever signalled.

What built, and when, is read from the compiler double's build log (COMPILER_DOUBLE_LOG: a line when a job starts and
one when it publishes its module) and from the kernel cache, never from how long a request took: the tests hold on a
loaded machine. The waits in the driver are safety limits, not asserted bounds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOUBLE = REPO / "tests" / "doubles" / "engine_double.py"

# Runs inside the namespace: starts the double, times what it does, prints one JSON object.
DRIVER = r"""
import json, os, socket, subprocess, sys, time, urllib.request, urllib.error
double, port, plan = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
began = time.monotonic()
proc = subprocess.Popen([sys.executable, double, "serve", "--port", str(port), "--served-model-name", "m"],
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
out = {}

def compilers():
    seen = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            comm = open(f"/proc/{pid}/comm").read().strip()
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        if comm == "cicc":
            fields = stat[stat.rfind(")") + 2:].split()
            seen.append({"pid": int(pid), "ticks": int(fields[11]) + int(fields[12]), "state": fields[0]})
    return seen

def builds():
    # The compiler double's build log, whole lines only (a job may be writing one now).
    try:
        text = open(plan["build_log"]).read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line]

def started(since):
    return [event["module"] for event in builds()[since:] if event["event"] == "start"]

def health():
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30).status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None

def idle(before, after):
    # One compiler, alive, asleep (not runnable: a starved worker would be R) and no CPU spent in between.
    return (len(before) == len(after) == 1 and before[0]["pid"] == after[0]["pid"]
            and before[0]["ticks"] == after[0]["ticks"] and after[0]["state"] == "S")

out["ready_s"] = None
while time.monotonic() - began < plan["ready_within"]:  # a safety limit, not a bound the tests assert
    out.setdefault("compilers_at_start", compilers())
    if health() == 200:
        out["ready_s"] = round(time.monotonic() - began, 2)
        break
    seen = compilers()
    out["compilers_while_starting"] = seen or out.get("compilers_while_starting", [])
    if plan.get("until_idle_compiler") and seen:
        time.sleep(1.0)
        later = compilers()
        if idle(seen, later):
            out["idle_compiler"], out["idle_compiler_later"] = seen, later
            out["health_once_idle"] = health()
            break
    time.sleep(0.1)
out["built_at_start"] = started(0)

def chat(temperature, timeout):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}],
                       "temperature": temperature, "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    since = len(builds())
    try:
        status = urllib.request.urlopen(request, timeout=timeout).status
    except OSError as error:
        status = str(error)
    return {"status": status, "started": started(since)}

if out["ready_s"] is not None:
    out["requests"] = [chat(t, plan.get("request_timeout", 60)) for t in plan["requests"]]
# Every build that started publishes before the namespace ends (a safety limit; a stalled one never does).
while plan.get("settle") and time.monotonic() - began < plan["ready_within"] + 60:
    events = builds()
    if sum(e["event"] == "start" for e in events) == sum(e["event"] == "published" for e in events):
        break
    time.sleep(0.1)
out["builds"] = builds()
print(json.dumps(out))
"""


def unshare_available() -> str | None:
    if os.geteuid() != 0:
        return "needs root (unshare --pid)"
    if shutil.which("unshare") is None:
        return "unshare(1) not found"
    return None


pytestmark = pytest.mark.skipif(unshare_available() is not None, reason=str(unshare_available()))


def scenario(tmp_path: Path, env: dict[str, str], plan: dict, port: int) -> dict:
    """The driver's account of one run: when it was ready, what each request answered and which builds it started,
    and the whole build log."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("ENGINE_DOUBLE_", "COMPILER_DOUBLE_"))}
    build_log = tmp_path / f"builds-{port}.log"
    environment.update(HOME=str(tmp_path / "home"), COMPILER_DOUBLE_LOG=str(build_log), **env)
    plan = {"build_log": str(build_log), "settle": True, **plan}
    result = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", DRIVER, str(DOUBLE),
                             str(port), json.dumps(plan)], env=environment, capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def cache_files(cache: Path) -> dict[str, tuple[int, int, int]]:
    """Each file of a kernel cache as (inode, size, mtime_ns): a rebuild publishes a new file by a rename."""
    return {p.name: (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(cache.iterdir())}


def test_unset_it_builds_nothing_and_serves_at_once(tmp_path):
    out = scenario(tmp_path, {}, {"ready_within": 60, "requests": [0, 0.6]}, 31871)
    assert out["ready_s"] is not None, out
    assert out.get("compilers_while_starting", []) == [] and out["built_at_start"] == [], out
    assert [r["status"] for r in out["requests"]] == [200, 200], out
    assert [r["started"] for r in out["requests"]] == [[], []], "a request ran a build"
    assert out["builds"] == [] and not (tmp_path / "builds-31871.log").exists(), "the compiler ran"
    assert not (tmp_path / "home" / ".cache").exists()


def test_a_cold_cache_builds_at_start_and_at_the_first_sampled_request_only(tmp_path):
    env = {"ENGINE_DOUBLE_COMPILE_START_S": "2", "ENGINE_DOUBLE_COMPILE_SAMPLED_S": "2"}
    out = scenario(tmp_path, env, {"ready_within": 60, "requests": [0, 0, 0.6, 0.6, 0]}, 31872)
    assert out["ready_s"] is not None, out
    assert out["compilers_while_starting"], "the start-up build ran no compiler"
    assert out["built_at_start"] == ["start.so"], out
    assert [r["status"] for r in out["requests"]] == [200] * 5, out
    started = [r["started"] for r in out["requests"]]
    assert started[0] == started[1] == [], "greedy requests never build"
    assert started[2] == ["sampling.so"], "the first sampled request builds the sampling kernels"
    assert started[3] == started[4] == [], "the sampling kernels are built once"
    assert [(e["event"], e["module"]) for e in out["builds"]] == [
        ("start", "start.so"), ("published", "start.so"), ("start", "sampling.so"), ("published", "sampling.so")]
    # the service user's cache, as the engine's (SGLang's ~/.cache/sglang/jit)
    cache = tmp_path / "home" / ".cache" / "sglang" / "jit"
    assert sorted(cache_files(cache)) == ["sampling.so", "start.so"]

    before = cache_files(cache)
    warm = scenario(tmp_path, env, {"ready_within": 60, "requests": [0.6]}, 31873)
    assert warm["ready_s"] is not None, warm
    assert warm.get("compilers_while_starting", []) == [] and warm["built_at_start"] == [], warm
    assert [r["status"] for r in warm["requests"]] == [200] and warm["requests"][0]["started"] == [], warm
    assert warm["builds"] == [] and not (tmp_path / "builds-31873.log").exists(), "a warm cache ran the compiler"
    assert cache_files(cache) == before, "a warm cache rebuilt a module"


def test_compile_stall_leaves_an_idle_compiler_and_no_answer(tmp_path):
    env = {"ENGINE_DOUBLE_COMPILE_START_S": "30", "ENGINE_DOUBLE_FAULT": "compile-stall",
           "ENGINE_DOUBLE_COMPILE_STALL_AFTER_S": "0.5", "ENGINE_DOUBLE_KERNEL_CACHE": str(tmp_path / "kernels")}
    # The driver waits (up to a safety limit) until the compiler has gone idle, then asks /health once more.
    plan = {"ready_within": 120, "requests": [], "until_idle_compiler": True, "settle": False}
    out = scenario(tmp_path, env, plan, 31874)
    assert out["ready_s"] is None, out
    assert "idle_compiler" in out, f"no compiler went idle: {out}"
    (idle,), (later,) = out["idle_compiler"], out["idle_compiler_later"]
    assert idle["pid"] == later["pid"] and idle["ticks"] == later["ticks"] and later["state"] == "S"
    assert out["health_once_idle"] != 200, out
    # It started, wrote some of its object file, and never published the module.
    assert [(e["event"], e["module"], e["pid"]) for e in out["builds"]] == [("start", "start.so", idle["pid"])]
    (partial,) = (tmp_path / "kernels").iterdir()
    assert partial.name == f"start.so.partial.{idle['pid']}" and partial.stat().st_size > 0


def test_hang_after_compile_builds_then_never_answers_the_sampled_request(tmp_path):
    env = {"ENGINE_DOUBLE_COMPILE_SAMPLED_S": "1.5", "ENGINE_DOUBLE_FAULT": "hang-after-compile",
           "ENGINE_DOUBLE_KERNEL_CACHE": str(tmp_path / "kernels")}
    out = scenario(tmp_path, env, {"ready_within": 60, "requests": [0, 0.6], "request_timeout": 4}, 31875)
    greedy, sampled = out["requests"]
    assert greedy["status"] == 200 and greedy["started"] == [], out
    assert "timed out" in str(sampled["status"]) and sampled["started"] == ["sampling.so"], out
    assert [(e["event"], e["module"]) for e in out["builds"]] == [
        ("start", "sampling.so"), ("published", "sampling.so")]
    assert (tmp_path / "kernels" / "sampling.so").exists()  # built, then hung
