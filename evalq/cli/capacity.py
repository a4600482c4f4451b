"""Capacity planning (``evalq plan``): how long each queue needs, which
constraint binds, and how many workers finish the job within a window.

The arithmetic, per queue kind:
- cpu: items (instances x cpu metric entries) / items per second per worker
  (``--cpu-items-per-s``; default 7,250: a 2-process worker on bleu, rouge and
  f1 in BENCHMARKS.md);
- gpu: pairs / pairs per second per worker (``--gpu-pairs-per-s``; default 180,
  BERTScore with the bundled model on CPU: measure your GPU and pass its figure);
- judge and generate: tokens are what the budget reserves per call (the prompt
  estimated with the budget's own estimator, plus ``max_tokens``), measured by
  running each metric's prompt builder on a sample of instances against a
  stand-in judge (claim extraction is assumed to find 3 claims per text). A
  judge's deployments together allow sum(TPM) tokens and sum(RPM) calls per
  minute, whatever the number of workers: its time is max(tokens / TPM, calls /
  RPM). A self-hosted deployment with no quota (``"capacity": "adaptive"``) is
  held by its calls in flight instead: its time is calls x seconds per call /
  calls in flight (its adaptive limit's ``max``, or with ``--broker`` the limit
  the cluster learned, and the least latency it saw per call). Workers needed
  for a judge queue: enough threads to keep that rate busy (calls per second x
  ``--call-seconds`` / 16 threads per worker), never more than its calls need.
The binding constraint is the queue that needs the longest time at the workers
you can add: a judge whose TPM alone exceeds the window cannot be fixed by workers.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

from evalq.shared.job.schema import Job
from evalq.shared.cluster.spec import is_model_run, is_variants

SAMPLE = 50
THREADS_PER_JUDGE_WORKER = 16


class _Recorder:
    """A stand-in judge: records what each call would reserve, answers with a valid reply."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self.calls = 0
        self.tokens = 0

    def predict(self, prompt: str, sample: int = 0) -> tuple[str, None]:
        """As the model under test: a stand-in answer to a prompt (variants runs)."""
        self.complete([{"role": "user", "content": prompt}])
        return "A generated answer of typical length for this question.", None

    def complete(self, messages: list[dict], schema: dict | None = None, schema_name: str = "rating",
                 sample: int = 0):
        from evalq.shared.judging.judge_reply import Reply
        from evalq.shared.judging.schema_values import schema_value
        from evalq.shared.judging.tokens import estimate_prompt_tokens

        extra = json.dumps(schema) if schema is not None else ""
        self.calls += 1
        self.tokens += estimate_prompt_tokens(messages, extra) + self.max_tokens
        if schema is None:
            return Reply("Reason: stand-in\nScore: 3", None)
        value = schema_value(schema, fields={"claims": "claim_1;claim_2;claim_3"}, seed=b"plan")
        return Reply(json.dumps(value), None)


def _sample(job: Job) -> list[dict]:
    rng = random.Random(0)
    items = list(job.instances) if len(job.instances) <= 10_000 else None
    if items is None:  # a spooled dataset: the first records
        items = []
        for inst in job.instances:
            items.append(inst)
            if len(items) >= 1000:
                break
    return rng.sample(items, min(SAMPLE, len(items)))


def plan_job(job: Job, window_s: float, cpu_items_per_s: float = 7250.0, gpu_pairs_per_s: float = 180.0,
             call_seconds: float = 1.0, learned: Any = None) -> dict[str, Any]:
    """``learned``: what a cluster learned of each deployment that learns its limits (``evalq plan
    --broker``): a function of (judge, deployment) -> {"tpm": ..., "rpm": ...} (what it has, or {})."""
    n = len(job.instances)
    sample = _sample(job)
    queues: list[dict] = []
    cpu_items = sum(job.span(m) for m in job.metrics if m.kind == "cpu")
    gpu_items = sum(job.span(m) for m in job.metrics if m.kind == "gpu")
    if cpu_items:
        seconds = cpu_items / cpu_items_per_s
        queues.append({"queue": "cpu", "items": cpu_items, "rate_per_worker": cpu_items_per_s,
                       "seconds_one_worker": seconds, "workers": max(1, math.ceil(seconds / window_s)),
                       "scalable": True})
    if gpu_items:
        seconds = gpu_items / gpu_pairs_per_s
        queues.append({"queue": "gpu", "items": gpu_items, "rate_per_worker": gpu_pairs_per_s,
                       "seconds_one_worker": seconds, "workers": max(1, math.ceil(seconds / window_s)),
                       "scalable": True})
    endpoints: dict[str, dict] = {}
    for m in job.runs:
        if m.judge is None or not sample:
            continue
        recorder = _Recorder(m.judge.max_tokens)
        fn = m.spec.load()
        for inst in sample:
            inst = dict(inst)
            if m.spec.id == "generate":
                if "actual-output" in inst:
                    continue
                from evalq.shared.model.runners import render_prompt

                recorder.complete([{"role": "user", "content": render_prompt(m.params.prompt_template, inst)}])
                continue
            inst.setdefault("actual-output", "A generated answer of typical length for this question.")
            if is_variants(m.key):  # the model answering the instance's variants, through the job's template
                from evalq.shared.model.runners import PromptedModel

                asked = PromptedModel(recorder, job.model.prompt_template)
            else:
                asked = recorder
            try:
                fn(inst, m.params, asked)
            except Exception:  # noqa: BLE001  (a stand-in reply a metric rejects: count what was asked)
                pass
        items = job.n_to_generate if m.spec.id == "generate" else job.span(m)
        scale = items / len(sample)
        name = "generate" if is_model_run(m.key) else m.params.judge
        known = [(d, (learned(m.judge, d) if learned is not None and d.learns else None) or {})
                 for d in m.judge.deployments]
        e = endpoints.setdefault(name, {"endpoint": name, "queues": sorted(set(m.queues)), "calls": 0.0,
                                        "tokens": 0.0, "tpm": sum(k.get("tpm") or d.tpm_start for d, k in known),
                                        "rpm": sum(k.get("rpm") or d.rpm_start for d, k in known), "entries": [],
                                        "learns": learning(m.judge.deployments),
                                        "learned": [{"region": d.region, **k} for d, k in known if k]})
        adaptive = [(d, k) for d, k in known if d.capacity == "adaptive" and d.tpm is None and d.rpm is None]
        if adaptive:  # no quota: its calls in flight hold it (what the cluster learned, else the bound)
            from evalq.shared.judging.capacity import Concurrency

            e["in_flight"] = sum(k.get("concurrency") or (d.concurrency or Concurrency()).max for d, k in adaptive)
            e["call_seconds"] = max([k["latency"] for _, k in adaptive if k.get("latency")] or [call_seconds])
        e["calls"] += recorder.calls * scale
        e["tokens"] += recorder.tokens * scale
        e["entries"].append({"entry": m.label, "calls_per_item": recorder.calls / len(sample),
                             "tokens_per_item": recorder.tokens / len(sample)})
    for e in endpoints.values():
        e["minutes_at_tpm"] = e["tokens"] / e["tpm"]
        e["minutes_at_rpm"] = e["calls"] / e["rpm"]
        e["seconds"] = 60 * max(e["minutes_at_tpm"], e["minutes_at_rpm"])
        e["limited_by"] = "tpm" if e["minutes_at_tpm"] >= e["minutes_at_rpm"] else "rpm"
        if e.get("in_flight"):
            e["minutes_in_flight"] = e["calls"] * e["call_seconds"] / e["in_flight"] / 60
            if 60 * e["minutes_in_flight"] >= e["seconds"]:
                e["seconds"], e["limited_by"] = 60 * e["minutes_in_flight"], "concurrency"
        calls_per_s = e["calls"] / e["seconds"] if e["seconds"] else 0.0
        threads = min(calls_per_s * e.get("call_seconds", call_seconds), e["calls"])  # no more than its calls
        e["workers"] = max(1, math.ceil(threads / THREADS_PER_JUDGE_WORKER))
        queues.append({"queue": ",".join(e["queues"]), "endpoint": e["endpoint"], "items": e["calls"],
                       "seconds_one_worker": e["seconds"], "workers": e["workers"], "scalable": False,
                       "limited_by": e["limited_by"]})
    binding = None
    if queues:
        times = [(q["seconds_one_worker"] / q["workers"] if q["scalable"] else q["seconds_one_worker"], q)
                 for q in queues]
        slowest, q = max(times, key=lambda t: t[0])
        binding = {"queue": q["queue"], "seconds": slowest,
                   "constraint": (f"{q['endpoint']}'s {q['limited_by'].upper()}" if not q["scalable"]
                                  else f"{q['queue']} workers"),
                   "fits_window": slowest <= window_s}
    from evalq.shared.judging.deployments import own_keys

    return {"n_instances": n, "window_s": window_s, "queues": queues, "endpoints": list(endpoints.values()),
            "binding": binding, "keys": key_variables(job), "own_keys": own_keys(job)}


def cluster_learned(r) -> Any:
    """What a cluster's Redis says each learning deployment has learned (``plan_job``'s ``learned``)."""
    from evalq.shared.cluster import keys
    from evalq.shared.judging.judges import deployment_id

    def learned(judge, d) -> dict[str, Any]:
        dep = deployment_id(judge, d)
        raw = r.hmget(keys.budget(dep, "learn"), ["tpm", "rpm"])
        axes = {axis: getattr(d, axis) for axis in ("tpm", "rpm")}
        out: dict[str, Any] = {axis: int(float(v)) for axis, v in zip(("tpm", "rpm"), raw)
                               if v is not None and axes[axis] == "auto"}
        if d.capacity == "adaptive":  # the limit of calls in flight, and the least latency per call it saw
            limit = r.hget(keys.budget(dep, "adapt"), "limit")
            if limit is not None and int(float(limit)) > 0:
                out["concurrency"] = int(float(limit))
            least = [float(v) for v in r.hvals(keys.budget(dep, "adapt:base")) if float(v) > 0]
            if least:
                out["latency"] = max(least)
        return out

    return learned


def learning(deployments) -> list[dict[str, str]]:
    """The deployments whose limits are learned while the job runs, and how (``evalq.shared.judging.capacity``)."""
    from evalq.shared.judging.capacity import describe

    return [{"region": d.region, "how": describe(d)} for d in deployments if d.learns]


def key_variables(job: Job) -> list[dict[str, Any]]:
    """The API key variables the job names (its judges' and its model's), each with its place
    and whether it is set here: a plan or an offline check reads none of them."""
    places = [(f"judges.{name}.api_key_env", judge.api_key_env) for name, judge in sorted(job.judges.items())
              if any(m.judge is judge for m in job.metrics)]
    if getattr(job.model, "api_key_env", None):
        places.append(("model.api_key_env", job.model.api_key_env))
    unset = {variable for _, variable in job.unset_keys}
    return [{"variable": variable, "where": where, "set": variable not in unset} for where, variable in places]


def render_keys(found: list[dict[str, Any]]) -> list[str]:
    """What a keyless check says of the key variables: named, and which are not set here."""
    if not found:
        return []
    missing = [k for k in found if not k["set"]]
    line = "keys: named, not read: " + ", ".join(f"{k['variable']} ({k['where']})" for k in found)
    if missing:
        line += (f"; not set here: {', '.join(sorted({k['variable'] for k in missing}))} (the workers that "
                 "call the endpoints need them)")
    return [line]


def render(plan: dict) -> list[str]:
    lines = [f"{plan['n_instances']} instances; window {plan['window_s'] / 3600:g} h"]
    for q in plan["queues"]:
        hours = q["seconds_one_worker"] / 3600
        if q["scalable"]:
            lines.append(f"  {q['queue']:<28} {q['items']:>12,.0f} items  {hours:8.2f} h for one worker "
                         f"-> {q['workers']} worker(s)")
        else:
            lines.append(f"  {q['queue']:<28} {q['items']:>12,.0f} calls  {hours:8.2f} h at the "
                         f"{q['limited_by'].upper()} of {q['endpoint']} -> {q['workers']} worker(s)")
    for e in plan["endpoints"]:
        if e.get("in_flight"):  # a self-hosted server without a quota: its calls in flight hold it
            lines.append(f"  {e['endpoint']}: no quota; {e['calls']:,.0f} calls x {e['call_seconds']:.2g} s, "
                         f"{e['in_flight']:,} at a time = {e['minutes_in_flight']:.1f} min")
        else:
            lines.append(f"  {e['endpoint']}: {e['tokens']:,.0f} tokens over {e['tpm']:,} TPM = "
                         f"{e['minutes_at_tpm']:.1f} min; {e['calls']:,.0f} calls over {e['rpm']:,} RPM = "
                         f"{e['minutes_at_rpm']:.1f} min")
        learned = {k["region"]: k for k in e.get("learned", [])}
        for k in learned.values():
            said = ", ".join([f"{axis.upper()} {k[axis]:,}" for axis in ("tpm", "rpm") if k.get(axis)]
                             + ([f"{k['concurrency']:,} calls in flight"] if k.get("concurrency") else [])
                             + ([f"{k['latency']:.2g} s per call"] if k.get("latency") else []))
            lines.append(f"    {k['region']}: the cluster has learned {said} (the times above are at it)")
        for learns in e.get("learns", []):
            if learns["region"] not in learned:
                lines.append(f"    {learns['region']} learns its capacity while it runs: {learns['how']} (the times "
                             "above are at where it starts; `--broker` reads what a cluster learned)")
    b = plan["binding"]
    if b:
        lines.append(f"binding constraint: {b['constraint']} ({b['seconds'] / 3600:.2f} h)"
                     + ("" if b["fits_window"] else "; it does NOT fit the window: add TPM/RPM (deployments), "
                                                   "not workers" if "TPM" in b["constraint"] or "RPM" in
                        b["constraint"] else "; it does NOT fit the window"))
    return lines + render_keys(plan.get("keys", [])) + render_own_keys(plan.get("own_keys", []))


def render_own_keys(found: list[dict[str, Any]]) -> list[str]:
    """Which deployments the job declares itself and what a cluster's workers give them."""
    lines = []
    for d in found:
        if d["policy"] == "own":
            lines.append(f"on a cluster: {d['where']} ({d['region']}, {d['endpoint']}) runs on budget keys of this "
                         "job's own: its TPM/RPM are not shared with other jobs on that endpoint (name a catalogue "
                         "deployment with 'use' to share them)")
        else:
            lines.append(f"on a cluster: {d['where']} ({d['region']}) is refused: the operator allows only catalogue "
                         "deployments (EVALQ_INLINE_DEPLOYMENTS / the catalogue's inline: deny)")
    return lines
