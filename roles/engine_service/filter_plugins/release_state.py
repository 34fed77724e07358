"""The release_state filters: state.json transitions, defined once in module_utils/bws_release_state.py (the
gpu_release module records a teardown on the target with the same functions)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "bws_release_state"
if _NAME not in sys.modules:
    _PATH = Path(__file__).resolve().parents[3] / "module_utils" / f"{_NAME}.py"
    _SPEC = importlib.util.spec_from_file_location(_NAME, _PATH)
    _MODULE = importlib.util.module_from_spec(_SPEC)
    sys.modules[_NAME] = _MODULE
    _SPEC.loader.exec_module(_MODULE)
_rs = sys.modules[_NAME]

release_state = _rs.release_state
release_last_good = _rs.release_last_good
release_rollback_target = _rs.release_rollback_target
release_state_switching = _rs.release_state_switching
release_state_serving = _rs.release_state_serving
release_state_rolled_back = _rs.release_state_rolled_back
release_state_stopped = _rs.release_state_stopped
releases_to_prune = _rs.releases_to_prune


class FilterModule:
    def filters(self) -> dict:
        return {
            "release_state": release_state,
            "release_rollback_target": release_rollback_target,
            "release_state_switching": release_state_switching,
            "release_state_serving": release_state_serving,
            "release_state_rolled_back": release_state_rolled_back,
            "releases_to_prune": releases_to_prune,
        }
