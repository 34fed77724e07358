# Copyright: the blackwell-llm-serving authors
# SPDX-License-Identifier: Apache-2.0
"""The release document (a release's ``release.json``): its schema, checked where it is written and where it is read.

An engine role produces the engine's part (``engine_service_release_facts``), engine_service adds its own (id, unit,
endpoint, bounds, gate, command line) and writes the whole as ``release.json``; verify, rollback, status and teardown
read it back. ``schema`` says which version of the layout a document has. Version 1 is FIELDS below: every key with
its types, none more (an engine's own facts go under ``engine_facts``).

Documents written before the ``schema`` field (version 0) are read with the stated defaults (DEFAULTS_V0: ``gate``
smoke, the gate those deploys ran; no stall bound; no speculative settings, interconnect proof or benchmark recipe
recorded: verify's smoke runs on such a release, its benchmark needs a redeploy), the keys the schema does not know
moved under ``engine_facts``, and every other key checked as in version 1. A document missing a required key, with a
key of the wrong type, with a key the schema does not know or of a newer version is refused, naming each key: the
deploy that wrote it is older than the key, or newer than this collection; redeploy the release (or run this
collection's version of the deploy).
"""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 1
NONE = type(None)
# key -> the JSON types it may have (bool is not an int here, an int is a float only where float is named).
FIELDS: dict[str, tuple[type, ...]] = {
    "schema": (int,),
    "id": (str,),
    "engine": (str,),
    "engine_version": (str,),
    "profile": (str,),
    "unit": (str,),
    "port": (int,),
    "listen_address": (str,),
    "base_url": (str,),
    "health_url": (str,),
    "ready_timeout_s": (int,),
    "stall_timeout_s": (int,),
    "gate": (str,),
    "exec_start": (list,),
    "interconnect_proof": (dict,),
    "venv": (str,),
    "executable": (str,),
    "served_model_name": (str,),
    "speculative": (bool,),
    "tokenizer": (str,),
    "trust_remote_code": (bool,),
    "speculative_num_steps": (int,),
    "speculative_settings": (dict,),
    "model_paths": (list,),
    "tensor_parallel_size": (int,),
    "layout": (dict,),
    "max_running_requests": (int, NONE),
    "bench": (dict,),
    "node_rank": (int,),
    "nnodes": (int,),
    "engine_facts": (dict,),
    "created": (str,),
}
# Keys engine_service adds, and `created`, which the writing module adds to a new release.
SERVICE_KEYS = ("schema", "id", "engine", "engine_version", "profile", "unit", "port", "listen_address", "base_url",
                "health_url", "ready_timeout_s", "stall_timeout_s", "gate", "exec_start", "interconnect_proof")
# `layout`: documents written before it read as {} (a tensor parallel layout of tensor_parallel_size ranks).
OPTIONAL = {"created": None, "node_rank": 0, "nnodes": 1, "engine_facts": {}, "layout": {}}
LIST_OF_STRINGS = ("exec_start", "model_paths")
GATES = ("none", "smoke", "full")
# What a version-0 document may lack, and what it is read as: the gate those deploys ran, no stall bound (they
# predate it), no engine settings of speculation or the interconnect proof recorded, no benchmark recipe (verify's
# smoke runs on it; to benchmark, redeploy).
DEFAULTS_V0 = {"gate": "smoke", "stall_timeout_s": 0, "speculative_settings": {}, "interconnect_proof": {},
               "bench": {}, "engine_facts": {}}


class DocumentError(ValueError):
    """A release document that does not have the schema's shape; the message names every key at fault."""


TYPE_NAMES = {int: "integer", str: "string", bool: "boolean", list: "list", dict: "mapping", NONE: "null"}


def _type_names(kinds: tuple[type, ...]) -> str:
    """'an integer or null', 'a string'."""
    words = [TYPE_NAMES[kind] for kind in kinds]
    return ("an " if words[0][0] in "aeiou" else "a ") + " or ".join(words)


def _json_type(value: Any) -> str:
    """The JSON type's name of a value (Ansible's tagged strings and mappings are str and dict subclasses)."""
    for kind in (bool, int, str, list, dict):
        if isinstance(value, kind):
            return TYPE_NAMES[kind]
    return "null" if value is None else type(value).__name__


def _has_type(value: Any, kinds: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


def key_problems(document: dict) -> list[str]:
    """What is wrong with a document's keys and their types (empty when nothing is)."""
    problems = [f"{key} is missing" for key in FIELDS if key not in document and key not in OPTIONAL]
    problems += [f"{key} is not a key of the release document (schema {SCHEMA_VERSION}; an engine's own facts go "
                 "under engine_facts)" for key in document if key not in FIELDS]
    for key, kinds in FIELDS.items():
        if key in document and not _has_type(document[key], kinds):
            problems.append(f"{key} must be {_type_names(kinds)}, got {_json_type(document[key])} "
                            f"{str(document[key])[:40]!r}")
        elif key in LIST_OF_STRINGS and key in document and not all(isinstance(v, str) for v in document[key]):
            problems.append(f"{key} must be a list of strings")
    if isinstance(document.get("gate"), str) and document["gate"] not in GATES:
        problems.append(f"gate must be one of {', '.join(GATES)}, got {document['gate']!r}")
    return problems


def upgraded(document: dict) -> dict:
    """A version-0 document (no `schema`) in version 1's layout, with DEFAULTS_V0; others unchanged."""
    if "schema" in document:
        return dict(document)
    engine_own = {key: value for key, value in document.items() if key not in FIELDS}
    known = {key: value for key, value in document.items() if key in FIELDS}
    return {**DEFAULTS_V0, **known, "schema": SCHEMA_VERSION,
            "engine_facts": {**engine_own, **known.get("engine_facts", {})}}


def checked_document(document: Any, where: str = "the release document") -> dict:
    """The document with its optional keys filled in; DocumentError naming every key at fault otherwise."""
    if not isinstance(document, dict):
        raise DocumentError(f"{where} must be a JSON object, got {_json_type(document)}")
    version = document.get("schema", 0)
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise DocumentError(f"{where} has schema {version}, newer than this collection reads ({SCHEMA_VERSION}): "
                            "run the deploy of the collection version that wrote it, or redeploy with this one")
    document = upgraded(document)
    problems = key_problems(document)
    if not problems and document["schema"] != SCHEMA_VERSION:
        problems.append(f"schema must be {SCHEMA_VERSION}, got {document['schema']}")
    if problems:
        raise DocumentError(f"{where}: " + "; ".join(problems))
    return {**{key: value for key, value in OPTIONAL.items() if value is not None}, **document}
