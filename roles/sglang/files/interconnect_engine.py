"""SGLang's own communication settings, for the interconnect proof (roles/engine_service/files/interconnect_proof.py).

The proof's ranks apply what SGLang sets in its own process before its first NCCL call, and write peer to peer when
the profile turns on SGLang's PCIe IPC all-reduce. Standard library only: the proof script loads this file by path
(``--engine-model``) on the host. SGLang 0.5.23.
"""

from __future__ import annotations

# The profile's switches that change what SGLang sets: the first two its NCCL memory settings, the others turn its CUDA
# graphs off (disable-cuda-graph both phases, the other two one phase each), and with them NCCL_GRAPH_REGISTER=0. The
# per-phase backend flags come as `cuda-graph-backend-<phase>=<backend>` words and win over the switches.
FLAGS = ("enable-symm-mem", "enable-nccl-nvls", "disable-cuda-graph", "disable-decode-cuda-graph",
         "disable-prefill-cuda-graph")
VALUED_FLAGS = ("cuda-graph-backend-decode", "cuda-graph-backend-prefill")
PHASES = ("decode", "prefill")
DISABLED = "disabled"
# The environment variables that turn on SGLang's own peer-to-peer all-reduce (beside its custom all-reduce).
PEER_ALL_REDUCE_SWITCHES = ("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE",)
TRUE_WORDS = ("true", "1", "yes", "y")  # SGLang's EnvBool (python/sglang/srt/environ.py)


def process_environment(env: dict[str, str], flags: list[str], world_size: int = 1) -> dict[str, str]:
    """What SGLang sets in its own process before its first NCCL call, given the environment it starts with.

    python/sglang/srt/entrypoints/engine.py ``_set_envs_and_config``: NCCL_CUMEM_ENABLE and NCCL_NVLS_ENABLE where
    unset (to 0; ``enable-symm-mem`` forces both to 1, ``enable-nccl-nvls`` forces NVLS to 1), and
    CUDA_DEVICE_MAX_CONNECTIONS=8 always.

    python/sglang/srt/arg_groups/parallel_hook.py ``handle_data_parallelism`` (resolution, in the server's process
    before the schedulers start, so they inherit it): NCCL_GRAPH_REGISTER=0 where unset (a value the unit sets wins)
    when a CUDA graph may capture a cross-rank collective (``_graph_may_capture_collectives``): more than one rank
    (the largest of TP, EP and DP size) and a CUDA graph in some phase, that is unless the profile turns every
    phase's graph off (``graphs_in_some_phase``). ``world_size`` is the number of ranks; a caller that does not know it
    gets what SGLang sets for one rank. Not modelled: resolution hooks that turn graphs off by themselves (SGLang's
    check errs toward registering nothing, as this model does), an explicit ``cuda-graph-config`` JSON, the MNNVL
    fabric (GB200, nnodes > 1), KV-cache sharding's symmetric scratch and ``dcp-size`` > 1
    (NCCL_GRAPH_MIXING_SUPPORT), none of which a PCIe host runs.
    """
    applied: dict[str, str] = {}
    symm, nvls = "enable-symm-mem" in flags, "enable-nccl-nvls" in flags
    if "NCCL_CUMEM_ENABLE" not in env or symm:
        applied["NCCL_CUMEM_ENABLE"] = str(int(symm))
    if "NCCL_NVLS_ENABLE" not in env or nvls or symm:
        applied["NCCL_NVLS_ENABLE"] = str(int(nvls or symm))
    applied["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    if world_size > 1 and graphs_in_some_phase(flags) and "NCCL_GRAPH_REGISTER" not in env:
        applied["NCCL_GRAPH_REGISTER"] = "0"
    return applied


def graphs_in_some_phase(flags: list[str]) -> bool:
    """Whether a phase keeps its CUDA graph, as python/sglang/srt/arg_groups/cuda_graph_hook.py
    ``parse_cuda_graph_config`` decides it: ``cuda-graph-backend-<phase>`` wins when given (off only when
    ``disabled``), else ``disable-<phase>-cuda-graph`` or the deprecated ``disable-cuda-graph`` turn it off."""
    backends = dict(word.split("=", 1) for word in flags if "=" in word)
    for phase in PHASES:
        backend = backends.get(f"cuda-graph-backend-{phase}")
        off = (backend == DISABLED if backend is not None
               else "disable-cuda-graph" in flags or f"disable-{phase}-cuda-graph" in flags)
        if not off:
            return True
    return False


def peer_all_reduce(env: dict[str, str]) -> str | None:
    """SGLang's peer-to-peer all-reduce that the environment turns on, or None."""
    if env.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "").strip().lower() in TRUE_WORDS:
        return "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE (FlashInfer PCIe IPC all-reduce)"
    return None
