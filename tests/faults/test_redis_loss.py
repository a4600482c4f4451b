"""The night survives its Redis (issue 72), as an operator meets it: each fault of
``tests.faults.drill`` (FLUSHALL; Redis SIGKILLed and replaced by an empty one; a Sentinel failover
with the old primary kept as a replica; the primary SIGKILLed under three sentinels; the primary
partitioned away and healed) at a seeded point of a job of bleu and coherence, while a client waits
with ``evalq run --broker``. The client exits 0; every (instance, entry) is there once with the value
it must have (nltk's BLEU computed directly; judge-sim's score as the item asks it); the cluster's
journal shows no chunk lost and judge calls paid again within those in flight at the fault (judge-sim's
own count agrees); both workers answer ``inspect ping`` after it. ``bench/bench_failover.py`` runs
each fault several times."""

from __future__ import annotations

import os

import pytest
from nltk.tokenize import wordpunct_tokenize
from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

from tests.faults import drill

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("EVALQ_DRILL_SEED", "72"))


@pytest.mark.parametrize("fault", drill.FAULTS)
def test_a_night_rides_its_redis_fault_and_ends_as_undisturbed(tmp_path, fault):
    if fault == "partition" and drill.can_partition():
        pytest.skip(drill.can_partition())
    out = drill.run(tmp_path, fault, seed=SEED + drill.FAULTS.index(fault))
    assert out.returncode == 0 and "Traceback" not in out.err, out.err
    if fault in ("flushall", "replaced"):  # said whether it looked while the state was gone or after the rebuild
        assert "lost the job's state" in out.err and "rebuilt from the job store; going on" in out.err, out.err

    # every (instance, entry) once, with the value it must have
    assert len({(line["instance_id"], line["metric"]) for line in out.log}) == len(out.log) == 2 * len(out.answered)
    by_id = {inst["id"]: inst for inst in out.job["instances"]}
    bleu = {line["instance_id"]: line["result"] for line in out.log if line["metric"] == "bleu"}
    assert bleu == pytest.approx({iid: sentence_bleu([wordpunct_tokenize(r) for r in inst["expected-output"]],
                                                     wordpunct_tokenize(inst["actual-output"]),
                                                     smoothing_function=SmoothingFunction().method1)
                                  for iid, inst in by_id.items()})
    assert {line["instance_id"]: line["result"]["score"] for line in out.log if line["metric"] == "coherence"} == \
        {iid: 1 + int(iid[1:]) % 5 for iid in by_id}

    # the history checker: nothing lost, calls paid again within the bound, workers live after it
    verdict = out.verdict
    print(f"{fault} at {out.point:.0%} of the judging: {verdict.line()}; {out.restarts} workers restarted")
    assert verdict.chunks > 0 and verdict.lost == [], verdict.line()
    assert verdict.calls >= len(by_id) and verdict.repaid <= verdict.in_flight, verdict.line()
    # judge-sim's own count of calls answered agrees with the journal's
    assert len(out.answered) == len(by_id)
    assert sum(count - 1 for count in out.answered.values()) <= verdict.in_flight
    assert verdict.alive == {"jobs", "judge"}
    assert verdict.recovered_after is not None or verdict.in_flight == 0
