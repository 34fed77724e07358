"""Secrets out of text the controller will keep: every form a secret takes in logs and payloads."""

from __future__ import annotations

import base64
import json

MASK = "********"


def secret_forms(secret: str) -> list[str]:
    """The secret as it is, JSON-escaped, Python-repr-escaped (SGLang logs its arguments with repr) and
    base64-encoded at each of the three byte alignments it can have inside a longer encoded text (the characters
    that encode only its own bytes); longest first, so a longer form is masked before a part of it."""
    forms = {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1]}
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + secret.encode("utf-8")).decode("ascii")
        core = encoded[4 if shift else 0:-4]
        if len(core) >= 8:  # shorter cores would mask ordinary text
            forms.add(core)
    return sorted((form for form in forms if form), key=len, reverse=True)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            for form in secret_forms(secret):
                text = text.replace(form, MASK)
    return text
