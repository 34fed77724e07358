"""The ENGINE TEST DOUBLE compiles on first use, as the engines do: with an empty kernel cache, a silent build by the
compiler TEST DOUBLE (a process named cicc) before /health answers (ENGINE_DOUBLE_COMPILE_START_S) and at the first
sampled request (ENGINE_DOUBLE_COMPILE_SAMPLED_S; greedy requests never build); a warm cache builds nothing; the faults
compile-stall (the compiler lives, idle) and hang-after-compile. Unset, nothing is built.

Each case runs in a PID namespace of its own (unshare --pid --fork --mount-proc, as root): the double and its compiler
end with the namespace, and no process outside it is ever signalled.
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

def health():
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30).status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None

while time.monotonic() - began < plan["ready_within"]:
    out.setdefault("compilers_at_start", compilers())
    if health() == 200:
        out["ready_s"] = round(time.monotonic() - began, 2)
        break
    out["compilers_while_starting"] = compilers() or out.get("compilers_while_starting", [])
    time.sleep(0.1)
else:
    out["ready_s"] = None
    out["idle_compiler"] = compilers()
    time.sleep(1.0)
    out["idle_compiler_later"] = compilers()

def chat(temperature, timeout):
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}],
                       "temperature": temperature, "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        status = urllib.request.urlopen(request, timeout=timeout).status
    except OSError as error:
        status = str(error)
    return {"status": status, "s": round(time.monotonic() - start, 2)}

if out["ready_s"] is not None:
    out["requests"] = [chat(t, plan.get("request_timeout", 30)) for t in plan["requests"]]
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
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ENGINE_DOUBLE_")}
    environment.update(HOME=str(tmp_path / "home"), **env)
    result = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", DRIVER, str(DOUBLE),
                             str(port), json.dumps(plan)], env=environment, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_unset_it_builds_nothing_and_serves_at_once(tmp_path):
    out = scenario(tmp_path, {}, {"ready_within": 10, "requests": [0, 0.6]}, 31871)
    assert out["ready_s"] < 2.0 and out.get("compilers_while_starting", []) == []
    assert [r["status"] for r in out["requests"]] == [200, 200] and all(r["s"] < 1.0 for r in out["requests"])
    assert not (tmp_path / "home" / ".cache").exists()


def test_a_cold_cache_builds_at_start_and_at_the_first_sampled_request_only(tmp_path):
    env = {"ENGINE_DOUBLE_COMPILE_START_S": "2", "ENGINE_DOUBLE_COMPILE_SAMPLED_S": "2"}
    out = scenario(tmp_path, env, {"ready_within": 15, "requests": [0, 0, 0.6, 0.6, 0]}, 31872)
    assert 2.0 <= out["ready_s"] <= 4.0, out
    assert out["compilers_while_starting"], "the start-up build ran no compiler"
    statuses, seconds = [r["status"] for r in out["requests"]], [r["s"] for r in out["requests"]]
    assert statuses == [200] * 5, out
    assert seconds[0] < 1.0 and seconds[1] < 1.0, "greedy requests never build"
    assert 2.0 <= seconds[2] <= 3.5, "the first sampled request builds the sampling kernels"
    assert seconds[3] < 1.0 and seconds[4] < 1.0
    # the service user's cache, as the engine's (SGLang's ~/.cache/sglang/jit)
    assert sorted(p.name for p in (tmp_path / "home" / ".cache" / "sglang" / "jit").iterdir()) == \
        ["sampling.so", "start.so"]

    warm = scenario(tmp_path, env, {"ready_within": 15, "requests": [0.6]}, 31873)
    assert warm["ready_s"] < 2.0 and warm.get("compilers_while_starting", []) == []
    assert warm["requests"][0]["s"] < 1.0


def test_compile_stall_leaves_an_idle_compiler_and_no_answer(tmp_path):
    env = {"ENGINE_DOUBLE_COMPILE_START_S": "30", "ENGINE_DOUBLE_FAULT": "compile-stall",
           "ENGINE_DOUBLE_COMPILE_STALL_AFTER_S": "0.5", "ENGINE_DOUBLE_KERNEL_CACHE": str(tmp_path / "kernels")}
    out = scenario(tmp_path, env, {"ready_within": 3, "requests": []}, 31874)
    assert out["ready_s"] is None
    (idle,), (later,) = out["idle_compiler"], out["idle_compiler_later"]
    assert idle["pid"] == later["pid"] and idle["ticks"] == later["ticks"] and later["state"] == "S"


def test_hang_after_compile_builds_then_never_answers_the_sampled_request(tmp_path):
    env = {"ENGINE_DOUBLE_COMPILE_SAMPLED_S": "1.5", "ENGINE_DOUBLE_FAULT": "hang-after-compile",
           "ENGINE_DOUBLE_KERNEL_CACHE": str(tmp_path / "kernels")}
    out = scenario(tmp_path, env, {"ready_within": 10, "requests": [0, 0.6], "request_timeout": 4}, 31875)
    greedy, sampled = out["requests"]
    assert greedy["status"] == 200 and "timed out" in str(sampled["status"]) and sampled["s"] >= 4.0
    assert (tmp_path / "kernels" / "sampling.so").exists()  # built, then hung
