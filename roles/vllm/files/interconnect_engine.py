"""vLLM's own communication settings, for the interconnect proof (roles/engine_service/files/interconnect_proof.py).

The proof's ranks apply what vLLM sets in its own process before its first NCCL call. Standard library only: the
proof script loads this file by path (``--engine-model``) on the host. vLLM 0.33.0.
"""

from __future__ import annotations

# No profile switch of vLLM changes what it sets; its peer-to-peer all-reduce is its custom all-reduce only.
FLAGS: tuple[str, ...] = ()
PEER_ALL_REDUCE_SWITCHES: tuple[str, ...] = ()
# With VLLM_BATCH_INVARIANT=1 vLLM sets these (vllm/model_executor/determinism/batch_invariant.py
# override_envs_for_invariance: NCCL_LAUNCH_MODE directly, the rest through vllm/utils/nccl.py pin_nccl_env),
# overriding what the unit sets.
BATCH_INVARIANT_NCCL = {
    "NCCL_LAUNCH_MODE": "GROUP", "NCCL_COLLNET_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", "NCCL_P2P_NET_DISABLE": "1",
    "NCCL_MIN_NCHANNELS": "1", "NCCL_MAX_NCHANNELS": "1", "NCCL_PROTO": "Simple",
    "NCCL_ALGO": "ring,tree;allreduce:tree", "NCCL_NTHREADS": "1", "NCCL_SOCKET_NTHREADS": "1"}


def process_environment(env: dict[str, str], flags: list[str]) -> dict[str, str]:
    """What vLLM sets in its own process before its first NCCL call: nothing on its default CUDA serving path,
    BATCH_INVARIANT_NCCL with VLLM_BATCH_INVARIANT=1. Not modelled: NCCL_GRAPH_REGISTER=0 (where unset) with the
    cuMem sleep mode (vllm/config/vllm.py)."""
    del flags  # none shape it
    try:
        invariant = int(env.get("VLLM_BATCH_INVARIANT", "0") or "0") != 0
    except ValueError:
        invariant = False
    return dict(BATCH_INVARIANT_NCCL) if invariant else {}


def peer_all_reduce(env: dict[str, str]) -> str | None:
    """No environment variable turns on a peer-to-peer all-reduce of vLLM's besides its custom all-reduce."""
    del env
    return None
