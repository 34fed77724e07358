"""Action plugin verify_report: the verify role's report, computed on the controller in the playbook's own process.

Acceptance over each benchmark window, the speed-up against the baseline and the gate (plugins/plugin_utils/
verify_report.py, which is also a command-line program), report.json, report.md, throughput.png (plugin_utils/
verify_chart.py) and, for a run without speculation, baseline.json, all under out_dir. Nothing on the host is touched.

Arguments: inputs (dict: what the role collected), out_dir (path), chart (bool, default true).
Returns: gate, summary, engine_is_test_double, files (as the command-line program prints them).
"""

from __future__ import annotations

import json
from pathlib import Path

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.blackwell.serving.plugins.plugin_utils import verify_report as report_program
from ansible_collections.blackwell.serving.plugins.plugin_utils.verify_chart import draw


def write_report(inputs: dict, out_dir: Path, chart: bool) -> dict:
    try:
        report, baseline_doc = report_program.build_report(inputs)
    except (report_program.InputError, ValueError, KeyError, OSError) as exc:
        raise AnsibleActionFail(f"verify report: {exc}") from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "inputs.json").write_text(json.dumps(inputs, indent=2) + "\n", encoding="utf-8")
    files = {"report_json": out_dir / "report.json", "report_md": out_dir / "report.md",
             "chart": out_dir / "throughput.png"}
    files["report_json"].write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    files["report_md"].write_text(report_program.markdown(report), encoding="utf-8")
    if baseline_doc is not None:
        files["baseline"] = out_dir / "baseline.json"
        files["baseline"].write_text(json.dumps(baseline_doc, indent=2) + "\n", encoding="utf-8")
    if chart:
        draw(report, files["chart"])
    return {"gate": report["gate"], "summary": report_program.summary_lines(report),
            "engine_is_test_double": report["engine_is_test_double"],
            "files": {k: str(v) for k, v in files.items()}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        unknown = sorted(set(args) - {"inputs", "out_dir", "chart"})
        if unknown or "inputs" not in args or "out_dir" not in args:
            raise AnsibleActionFail(f"verify_report needs inputs and out_dir (chart is optional); got {sorted(args)}")
        if not isinstance(args["inputs"], dict):
            raise AnsibleActionFail("verify_report: inputs must be a mapping")
        result.update(write_report(args["inputs"], Path(str(args["out_dir"])), bool(args.get("chart", True))))
        result["changed"] = False  # controller artefacts only: a new report directory each run
        return result
