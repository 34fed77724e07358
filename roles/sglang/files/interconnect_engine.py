"""SGLang's own communication settings, for the interconnect proof (roles/engine_service/files/interconnect_proof.py).

The proof's ranks apply what SGLang sets in its own process before its first NCCL call, and write peer to peer when
the profile turns on SGLang's PCIe IPC all-reduce. Standard library only: the proof script loads this file by path
(``--engine-model``) on the host. SGLang 0.5.23.
"""

from __future__ import annotations

# The profile's switches that change what SGLang sets.
FLAGS = ("enable-symm-mem", "enable-nccl-nvls")
# The environment variables that turn on SGLang's own peer-to-peer all-reduce (beside its custom all-reduce).
PEER_ALL_REDUCE_SWITCHES = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",)
TRUE_WORDS = ("true", "1", "yes", "y")  # SGLang's EnvBool (python/sglang/srt/environ.py)


def process_environment(env: dict[str, str], flags: list[str]) -> dict[str, str]:
    """What SGLang sets in its own process before its first NCCL call, given the environment it starts with.

    python/sglang/srt/entrypoints/engine.py ``_set_envs_and_config``: NCCL_CUMEM_ENABLE and NCCL_NVLS_ENABLE where
    unset (to 0; ``enable-symm-mem`` forces both to 1, ``enable-nccl-nvls`` forces NVLS to 1), and
    CUDA_DEVICE_MAX_CONNECTIONS=8 always. Not modelled: the MNNVL fabric (GB200, nnodes > 1), KV-cache sharding's
    symmetric scratch and ``dcp-size`` > 1 (NCCL_GRAPH_MIXING_SUPPORT), none of which a PCIe host runs.
    """
    applied: dict[str, str] = {}
    symm, nvls = "enable-symm-mem" in flags, "enable-nccl-nvls" in flags
    if "NCCL_CUMEM_ENABLE" not in env or symm:
        applied["NCCL_CUMEM_ENABLE"] = str(int(symm))
    if "NCCL_NVLS_ENABLE" not in env or nvls or symm:
        applied["NCCL_NVLS_ENABLE"] = str(int(nvls or symm))
    applied["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    return applied


def peer_all_reduce(env: dict[str, str]) -> str | None:
    """SGLang's peer-to-peer all-reduce that the environment turns on, or None."""
    if env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "").strip().lower() in TRUE_WORDS:
        return "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE (FlashInfer PCIe IPC all-reduce)"
    return None
