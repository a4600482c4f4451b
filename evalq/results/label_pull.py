"""Pulling people's labels of a suite's nights into the history store and measuring its judges against
them (``evalq.results.labels``): ``evalq labels`` for the nights it is asked about, and the final
callback for the night before its own, from the job's Phoenix and MLflow sinks, so that each night's
report says how its judges fared against what people gave since the last one."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, field, replace

from evalq.results.label_sources import mlflow_labels, night_of, phoenix_labels
from evalq.results.labels import (Label, Pairs, agreement_line, entry_agreement, judged_value, keep, kept_night,
                                  labels_of, person_value, set_agreement_alert, store_agreement)

log = logging.getLogger("evalq.history")


@dataclass
class Pulled:
    """What a pull did: labels new, updated, unchanged and not matched to a judged item; per night with
    labels, its entries' agreement."""

    counts: dict[str, int] = field(default_factory=dict)
    unmatched: int = 0
    nights: list[dict] = field(default_factory=list)


def pull(store, suite: str, runs: list[dict], readers: dict[str, tuple[str, str]], from_files: list[Label],
         min_alpha: float) -> Pulled:
    """The labels of ``runs`` (the suite's nights that ended done, oldest first) from ``readers`` (sink
    name -> (kind, base URL)) and ``from_files``, kept once each; then each night's agreement."""
    nights = {run["job_id"]: night_of(run["job_id"], run.get("out")) for run in runs}
    tenant = runs[-1].get("tenant") if runs else None
    matched: list[Label] = []
    unmatched = 0
    for run in runs:
        night = nights[run["job_id"]]
        if night is None:
            continue
        for name, (kind, base) in readers.items():
            read = phoenix_labels(name, base, night) if kind == "phoenix" else mlflow_labels(name, base, night)
            for label, items in read:
                if not items:
                    unmatched += 1
                for iid, _ in items:
                    matched.append(replace(label, instance_id=iid))
    for label in from_files:  # a file's label grades the night it names, else the one it was first given to,
        # else the latest night that judged the item before it was labelled (or at all, undated)
        given = label.labelled_at.isoformat(timespec="seconds") + "+00:00" if label.labelled_at else None
        job = label.job_id or kept_night(store.engine, suite, label) or next(
            (run["job_id"] for run in reversed(runs) if nights[run["job_id"]] is not None
             and (label.instance_id, label.name) in nights[run["job_id"]].items
             and (given is None or run["finished_at"] <= given)), None)
        if job is None or nights.get(job) is None or (label.instance_id, label.name) not in nights[job].items:
            unmatched += 1
            continue
        matched.append(replace(label, job_id=job))
    counts = keep(store.engine, suite, tenant, matched)
    return Pulled(counts, unmatched, night_agreements(store, suite, runs, nights, min_alpha))


def night_agreements(store, suite: str, runs: list[dict], nights: dict, min_alpha: float) -> list[dict]:
    """Per night with labels: each judge entry's agreement with them, kept in the store (and alerted
    when below ``min_alpha``)."""
    from evalq.shared.core.config import env_number
    from evalq.shared.metrics.registry import REGISTRY

    min_n = int(env_number("EVALQ_LABELS_MIN_N", 20))
    out = []
    for run in runs:
        night = nights[run["job_id"]]
        given = labels_of(store.engine, suite, run["job_id"]) if night is not None else []
        if not given:
            continue
        per: dict[str, Pairs] = defaultdict(Pairs)
        for label in given:
            item = night.items.get((label["instance_id"], label["name"]))
            if item is None:
                continue
            metric, params, result = item
            kind = REGISTRY.get(metric).aggregation
            judge = judged_value(kind, params, result)
            if judge is None:
                continue
            person = person_value(kind, params, label["value"])
            found = per[label["name"]]
            found.pairs.append((judge, person))
            found.annotators.add(label["annotator"])
            for member, got in ((result or {}).get("members") or {}).items():
                value = judged_value(kind, params, got)
                if value is not None:
                    found.members.setdefault(member, []).append((value, person))
        entries = {}
        for name, found in sorted(per.items()):
            got = entry_agreement(found)
            got["below"] = got["alpha"] is not None and got["alpha"] < min_alpha and got["n"] >= min_n
            entries[name] = got
            if store_agreement(store.engine, run["job_id"], name, got):
                _alert(store, suite, run["job_id"], name, got, min_alpha)
        if entries:
            out.append({"job_id": run["job_id"], "finished_at": run["finished_at"], "entries": entries})
    return out


def _alert(store, suite: str, job_id: str, name: str, got: dict, min_alpha: float) -> None:
    """The drop below the bound, told once (``EVALQ_ALERT_WEBHOOK``), like a regression."""
    import os

    from evalq.results.alerts import WEBHOOK_ENV, post
    from evalq.shared.core.display import chat_text

    url = os.environ.get(WEBHOOK_ENV, "").strip()
    if not url:
        set_agreement_alert(store.engine, job_id, name, "none")
        return
    text = (f"{chat_text(suite)}: judge agreement with people below {min_alpha:g} in job {job_id}: "
            f"{chat_text(agreement_line(name, got))}")
    body = {"suite": suite, "job_id": job_id, "regressions": [], "judge_changes": [],
            "people": [{"name": name, **{k: got.get(k) for k in ("n", "exact", "within_1", "alpha")},
                        "bound": min_alpha}], "text": text}
    try:
        post(url, json.dumps(body, ensure_ascii=False).encode())
    except Exception:  # noqa: BLE001  (a webhook never fails the command)
        set_agreement_alert(store.engine, job_id, name, "failed")
        log.error("suite %s: the alert for %s's agreement with people in job %s could not be sent", suite, name, job_id)
        return
    set_agreement_alert(store.engine, job_id, name, "sent")


def before_a_night(store, spec, job_id: str) -> Pulled | None:
    """The final callback's pull, before it says how the judges fare against people: the labels people
    gave the suite's previous night on the job's own Phoenix and MLflow sinks (None: it has none)."""
    from evalq.results.sinks import named_sink

    readers = {}
    for name in spec.sinks:
        found = named_sink(spec, name)
        if found is not None and found.kind in ("phoenix", "mlflow"):
            readers[found.name] = (found.kind, found.base)
    if not readers:
        return None
    runs = [run for run in store.runs_of(spec.series, 1) if run["status"] == "done" and run["job_id"] != job_id
            and run.get("tenant") in (None, spec.tenant)]
    if not runs:
        return None
    return pull(store, spec.series, runs, readers, [], spec.regression.min_alpha)
