"""gpu_release, report: the one-screen summary and the failure message. A process is named by pid, title and user
only (see procfs.Proc.brief): its arguments never reach the controller.

Stdlib only; runs on the target.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.blackwell.serving.plugins.module_utils.gpu_release.units import unit_lines


def who(p: dict[str, Any]) -> str:
    """A process as the summary names it: pid, title and user (Proc.brief), never its arguments."""
    return f"{p['pid']} {p['title']} ({p['user']})"


def gpu_line(g: dict[str, Any]) -> str:
    roles: dict[str, int] = {}
    for h in g["holders"]:
        roles[h["role"]] = roles.get(h["role"], 0) + 1
    found = ", ".join(f"{n} {r}" for r, n in sorted(roles.items())) or "no holders"
    mem = ""
    if g.get("memory_used_before_mib") is not None:
        before, after = g["memory_used_before_mib"], g["memory_used_after_mib"]
        mem = f"; {before} -> {after} MiB (freed {g['freed_mib']})"
    if g.get("wedged"):
        state = f"WEDGED: {g['wedged']}; needs `nvidia-smi -r` or a reboot"
    elif g.get("clean") is None:
        state = "not verified"
    elif g["clean"]:
        state = "clean"
    else:
        users = ", ".join(str(a["pid"]) for a in g.get("apps_after", [])) or "targets still alive"
        state = f"NOT clean (compute apps left: {users})"
    return f"GPU {g['index'] if g['index'] is not None else '?'} (minor {g['minor']}): {found}{mem}; {state}"


def summarize(result: dict[str, Any]) -> list[str]:
    lines = unit_lines(result["units"], result["check_mode"]) if result["stop_units"] else []
    lines.append(result["scope_description"])
    if result["nvidia_smi_error"]:
        lines.append(f"nvidia-smi gave no answer: GPU verification skipped ({result['nvidia_smi_error']})")
    elif result["gpu_verification"] == "skipped":
        lines.append(f"no NVIDIA driver on this host: GPU verification skipped ({result['gpu_verification_reason']})")
    lines.extend(gpu_line(g) for g in result["gpus"])
    sig = result["signalled"]
    if result["report_only"]:
        lines.append(f"targets {len(result['targets'])} (report only: nothing sent)")
    else:
        lines.append(
            f"targets {len(result['targets'])}: TERM {len(sig['TERM'])}, KILL {len(sig['KILL'])}"
            + (" (check mode: nothing sent)" if result["check_mode"] else "")
        )
    for s in result["spared"]:
        lines.append(f"spared {who(s)}: {s['reason']}")
    for f in result["foreign"]:
        on = f" on GPUs {f['gpus']}" if f.get("gpus") else ""
        lines.append(f"foreign, not signalled: {who(f)}{on}: {f['reason']}")
    for a in result["unattributed_apps"]:
        lines.append(f"unattributed compute app pid {a['pid']} ({a['name']}) {a['used_mib']} MiB: PID not visible here")
    shm = result["shm"]
    removed = shm["would_remove"] if result["check_mode"] else shm["removed"]
    verb = "would remove" if result["check_mode"] else "removed"
    lines.append(
        f"/dev/shm: {verb} {len(removed)}, kept {len(shm['kept'])}"
        + (f" ({shm['skipped']})" if shm.get("skipped") else f" (entries of {', '.join(shm['owners']) or 'nobody'})")
    )
    lines.append(
        f"elapsed {result['elapsed_s']} s"
        + (f", release {result['release_s']} s" if result["release_s"] is not None else "")
    )
    return lines


def failure(result: dict[str, Any], targets: dict[int, dict[str, Any]], left_on_gpu: set[int], params) -> str:
    stuck = [targets[p] for p in sorted(targets) if not targets[p]["exited"] or p in left_on_gpu]
    if stuck and not result["check_mode"] and not result["report_only"]:
        names = "; ".join(f"PID {who(t)} on GPUs {t['gpus']}" for t in stuck)
        return f"still running or holding GPU memory after {params['timeout_s']} s: {names}"
    if result["nvidia_smi_error"]:
        return result["nvidia_smi_error"]
    if result["wedged"]:
        names = "; ".join(f"GPU {w['index']} ({w['uuid'] or w['bus_id']}): {w['text']}" for w in result["wedged"])
        return f"wedged GPU, needs `nvidia-smi -r` (with nothing using it) or a reboot: {names}"
    if params["fail_on_foreign_holders"] and result["foreign_holders"]:
        names = "; ".join(f"PID {who(f)} on GPUs {f['gpus']}" for f in result["foreign_holders"])
        return f"foreign processes use the GPUs (not signalled): {names}"
    if params["fail_on_foreign_holders"] and result["unattributed_apps"]:
        apps = result["unattributed_apps"]
        names = "; ".join(f"PID {a['pid']} ({a['name']}) {a['used_mib']} MiB on GPU {a['gpu_index']}" for a in apps)
        return f"processes this host's PID namespace cannot see use the GPUs: {names}"
    if result["units_left"]:
        return "engine units not stopped cleanly: " + "; ".join(result["units_left"])
    return ""
