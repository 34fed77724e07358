"""vLLM's own communication settings, for the interconnect proof (roles/engine_service/files/interconnect_proof.py).

The proof's ranks apply what vLLM sets in its own process before its first NCCL call, and write peer to peer when
the unit's environment turns on vLLM's FlashInfer PCIe IPC all-reduce. Standard library only: the proof script loads
this file by path (``--engine-model``) on the host. vLLM 0.33.0.
"""

from __future__ import annotations

# No profile switch of vLLM changes what it sets.
FLAGS: tuple[str, ...] = ()
# Besides its custom all-reduce (off with --disable-custom-all-reduce), vLLM has a peer-to-peer all-reduce of its own
# that this variable turns on, whatever that flag says (vllm/envs.py; vllm/distributed/device_communicators/
# cuda_communicator.py builds FlashInferPcieIpcAllReduce for the TP group at world size > 1).
PEER_ALL_REDUCE_SWITCHES = ("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",)
# With VLLM_BATCH_INVARIANT=1 vLLM sets these (vllm/model_executor/determinism/batch_invariant.py
# override_envs_for_invariance: NCCL_LAUNCH_MODE directly, the rest through vllm/utils/nccl.py pin_nccl_env),
# overriding what the unit sets.
BATCH_INVARIANT_NCCL = {
    "NCCL_LAUNCH_MODE": "GROUP", "NCCL_COLLNET_ENABLE": "0", "NCCL_NVLS_ENABLE": "0", "NCCL_P2P_NET_DISABLE": "1",
    "NCCL_MIN_NCHANNELS": "1", "NCCL_MAX_NCHANNELS": "1", "NCCL_PROTO": "Simple",
    "NCCL_ALGO": "ring,tree;allreduce:tree", "NCCL_NTHREADS": "1", "NCCL_SOCKET_NTHREADS": "1"}


def _int_switch(env: dict[str, str], name: str) -> bool:
    """vLLM's reading of a 0/1 variable (vllm/envs.py: ``bool(int(os.getenv(name, "0")))``); a value it cannot read
    stops vLLM at start, so it turns nothing on here."""
    try:
        return int(env.get(name, "0") or "0") != 0
    except ValueError:
        return False


def process_environment(env: dict[str, str], flags: list[str], world_size: int = 1) -> dict[str, str]:
    """What vLLM sets in its own process before its first NCCL call: nothing on its default CUDA serving path,
    BATCH_INVARIANT_NCCL with VLLM_BATCH_INVARIANT=1, at any world size. Not modelled: NCCL_GRAPH_REGISTER=0 (where
    unset) with the cuMem sleep mode (vllm/config/vllm.py)."""
    del flags, world_size  # neither shapes it
    return dict(BATCH_INVARIANT_NCCL) if _int_switch(env, "VLLM_BATCH_INVARIANT") else {}


def peer_all_reduce(env: dict[str, str]) -> str | None:
    """vLLM's peer-to-peer all-reduce that the environment turns on besides its custom all-reduce, or None.

    VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC=1 builds FlashInfer's PCIe CUDA-IPC all-reduce for the tensor-parallel
    group, independently of --disable-custom-all-reduce, unless VLLM_BATCH_INVARIANT=1 (no fixed reduction order):
    vllm/distributed/device_communicators/cuda_communicator.py, ``use_flashinfer_pcie_ipc_allreduce``.
    """
    if _int_switch(env, "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC") and not _int_switch(env, "VLLM_BATCH_INVARIANT"):
        return "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC (FlashInfer PCIe IPC all-reduce)"
    return None
