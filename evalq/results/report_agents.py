"""report.html's view of an agent's item: the calls made against the calls expected, side by side
(with the judge's verdict on each call where a metric rated them), and a conversation's turns."""

from __future__ import annotations

import json
from typing import Any

from evalq.results.markup import esc
from evalq.shared.agents.trajectory import Call, read, side_by_side

CSS = (".traj td{vertical-align:top}.traj .same{color:#1b7f3b}.traj .extra,.traj .missing{color:#b3261e}"
       ".traj .arguments{color:#a15c00}")


def _call(call: Call | None) -> str:
    if call is None:
        return ""
    return f"<code>{esc(call.name)}({esc(json.dumps(call.arguments, ensure_ascii=False, sort_keys=True))})</code>"


def _verdicts(result: Any, n_made: int) -> list[dict | None]:
    """The judge's verdict on each call made, in order, where the result rates calls
    (tool_call_accuracy: the last turn's calls, or every turn's with ``turns: all``)."""
    if not isinstance(result, dict):
        return [None] * n_made
    if isinstance(result.get("calls"), list):
        rated = result["calls"]
    elif isinstance(result.get("turns"), list) and all("calls" in t for t in result["turns"]):
        rated = [c for t in result["turns"] for c in t["calls"]]
    else:
        return [None] * n_made
    rated = rated[-n_made:] if n_made else []
    return [None] * (n_made - len(rated)) + list(rated)  # ``last`` rates the run's final calls


def trajectory_html(inst: dict, result: Any) -> str:
    """The side-by-side table of an agent item, or "" for an item that is not an agent's run."""
    if not isinstance(inst.get("messages"), list) or not (
            "expected_tool_calls" in inst or any(m.get("tool_calls") for m in inst["messages"] if isinstance(m, dict))):
        return ""
    made, wanted, _ = read(inst)
    verdicts = iter(_verdicts(result, len(made)))
    by_call = {id(c): next(verdicts) for c in made}
    rows = []
    for a, b, status in side_by_side(made, wanted) if "expected_tool_calls" in inst else [(c, None, "") for c in made]:
        verdict = by_call.get(id(a)) if a is not None else None
        judged = f"{verdict['score']}: {esc(verdict.get('reason', ''))}" if isinstance(verdict, dict) else ""
        marked = f"<td class='{status.split()[0]}'>{esc(status)}</td>" if status else "<td></td>"
        rows.append(f"<tr><td>{_call(a)}</td><td>{_call(b)}</td>{marked}<td>{judged}</td></tr>")
    out = ["<p><b>tool calls</b> (made / expected)</p><table class=traj><tr><th>made</th><th>expected</th>"
           "<th></th><th>judge on the call</th></tr>", "".join(rows), "</table>"]
    return "".join(out)


def turns_html(result: Any) -> str:
    """A conversation scored turn by turn: each turn's score and the judge's reason."""
    if not isinstance(result, dict) or not isinstance(result.get("turns"), list):
        return ""
    rows = "".join(f"<tr><td>{esc(t.get('turn'))}</td><td>{esc(t.get('score', ''))}</td>"
                   f"<td>{esc(t.get('reason') or t.get('error') or '')}</td></tr>" for t in result["turns"])
    return f"<p><b>turns</b></p><table><tr><th>turn</th><th>score</th><th>judge reason</th></tr>{rows}</table>"
