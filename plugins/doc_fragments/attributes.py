# SPDX-License-Identifier: Apache-2.0
"""Documentation fragment: the attributes the collection's modules share."""

from __future__ import annotations


class ModuleDocFragment:
    # A module that supports check mode fully, shows no diff and runs on POSIX hosts.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""
