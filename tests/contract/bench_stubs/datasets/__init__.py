"""TEST STUB of Hugging Face `datasets` for running SGLang's real benchmark client in the CPU contract venv.

sglang/benchmark/datasets/mmmu.py (0.5.23) imports `load_dataset` at module level, so `python -m
sglang.benchmark.serving` cannot start without the package (pyarrow, pandas: far more than the client's sharegpt
and random-ids workloads use; they never call it). Any call fails loudly. The GPU host venv has the real one.
"""

IS_CONTRACT_STUB = True


def load_dataset(*_args, **_kwargs):
    raise RuntimeError("datasets.load_dataset is a contract-test stub: the verify workloads never download datasets")
