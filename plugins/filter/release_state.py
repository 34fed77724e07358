"""The release_state filters: state.json transitions, defined once in plugins/module_utils/release/state.py (the
gpu_release module records a teardown on the target with the same functions)."""

from __future__ import annotations

from ansible_collections.blackwell.serving.plugins.module_utils.release.state import (
    release_last_good,
    release_rollback_target,
    release_state,
    release_state_rolled_back,
    release_state_serving,
    release_state_stopped,
    release_state_switching,
    release_to_boot,
    release_to_restore,
    releases_to_prune,
)

__all__ = ["FilterModule", "release_last_good", "release_rollback_target", "release_state", "release_state_rolled_back",
           "release_state_serving", "release_state_stopped", "release_state_switching", "release_to_boot",
           "release_to_restore", "releases_to_prune"]


class FilterModule:
    def filters(self) -> dict:
        return {
            "release_state": release_state,
            "release_rollback_target": release_rollback_target,
            "release_state_switching": release_state_switching,
            "release_state_serving": release_state_serving,
            "release_state_rolled_back": release_state_rolled_back,
            "release_to_restore": release_to_restore,
            "releases_to_prune": releases_to_prune,
        }
