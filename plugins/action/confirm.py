"""Action plugin confirm: ask the person at the controller's terminal to confirm, once, before a play stops things.

Runs on the controller (use it with run_once). With a given answer (``confirm``: true goes on, false stops) or in
check mode (nothing would change) it does not ask. Where nobody can answer (no terminal on the controller's stdin:
cron, ssh without a tty, CI, a pipe, as Ansible's prompt tells it; or ansible-runner, which runs ansible-playbook on
a pseudo-terminal nobody types at) it refuses, failing the task before anything changed and naming the variable that
answers ahead (as kubespray's reset refuses unless told): a job that stops serving says so in its own command line.
Otherwise it prints ``lines`` and ``question`` and goes on only on ``yes`` (or ``y``); anything else fails the task,
and with it the play, before anything changed.

Arguments: question (str), lines (list of str: what would be done), confirm (bool or null), variable (str: the name
of the variable that gives the answer, for the messages).
Returns: confirmed (bool), asked (bool), how (str: given, check mode, answered).
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleActionFail, AnsiblePromptInterrupt, AnsiblePromptNoninteractive
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()
YES = ("yes", "y")
# What ansible-runner puts in the environment of the ansible-playbook it starts (ansible_runner/config/_base.py,
# config/runner.py).
RUNNER_ENVIRONMENT = frozenset(("AWX_ISOLATED_DATA_DIR", "RUNNER_OMIT_EVENTS"))


def _answer(value: object) -> bool | None:
    """The given answer, or None where none was given."""
    if value is None or value == "":
        return None
    try:
        return boolean(value, strict=True)
    except TypeError as exc:
        raise AnsibleActionFail(f"the answer must be yes or no, not {value!r}") from exc


def _nobody_to_ask(why: str, variable: str) -> str:
    return (f"Nobody to ask: {why}. Refusing to go on unasked: give -e {variable}=yes to go on without the question. "
            "Stopped before anything changed.")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("question", "lines", "confirm", "variable"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        question, variable = str(args.get("question", "Go on?")), str(args.get("variable", "confirm"))
        lines = [str(line) for line in args.get("lines") or []]
        given = _answer(args.get("confirm"))
        result.update(changed=False, asked=False)
        if given is not None:
            if not given:
                raise AnsibleActionFail(f"{variable}=no: stopped before anything changed.")
            return {**result, "confirmed": True, "how": "given", "msg": f"Confirmed by {variable}=yes."}
        if self._task.check_mode:
            return {**result, "confirmed": True, "how": "check mode",
                    "msg": "Check mode: nothing changes, so nothing is asked."}
        if RUNNER_ENVIRONMENT & set(os.environ):
            # ansible-runner (AWX, CI jobs) runs ansible-playbook on a pseudo-terminal of its own that nobody types
            # at: Ansible's prompt would wait there for ever.
            raise AnsibleActionFail(_nobody_to_ask("run by ansible-runner, whose terminal nobody types at", variable))
        prompt = "\n".join([*lines, "", f"{question} Type yes to go on (or give -e {variable}=yes): "])
        try:
            reply = display.prompt_until(prompt, private=False)
        except AnsiblePromptNoninteractive as exc:
            raise AnsibleActionFail(_nobody_to_ask("no terminal to ask on (cron, ssh without a tty, CI, a pipe)",
                                                   variable)) from exc
        except AnsiblePromptInterrupt as exc:
            raise AnsibleActionFail("Interrupted at the question: stopped before anything changed.") from exc
        answer = reply.decode(errors="replace").strip() if isinstance(reply, bytes) else str(reply).strip()
        if answer.lower() not in YES:
            raise AnsibleActionFail(f"Not confirmed (the answer was {answer!r}, not yes): stopped before anything "
                                    "changed.")
        return {**result, "confirmed": True, "asked": True, "how": "answered", "msg": "Confirmed at the terminal."}
