"""The release_document filter: a release.json checked against its schema (plugins/module_utils/release/document.py),
where the deploy writes it and wherever a playbook reads it."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.blackwell.serving.plugins.module_utils.release.document import (
    SCHEMA_VERSION,
    DocumentError,
    checked_document,
)

__all__ = ["FilterModule", "release_document"]


def release_document(document: Any, where: str = "the release document") -> dict:
    """The document with its optional keys filled in; a filter error naming every key at fault otherwise."""
    try:
        return checked_document(document, where)
    except DocumentError as exc:
        # Not chained: Ansible would print the cause's message a second time.
        raise AnsibleFilterError(f"{exc} (release document schema {SCHEMA_VERSION}, "
                                 "docs/release-document.md)") from None


class FilterModule:
    def filters(self) -> dict:
        return {"release_document": release_document}
