"""The night survives its Redis (issue 72), as an operator meets it: a Redis whose memory is lost
(FLUSHALL; SIGKILLed and replaced by an empty one, ``tests.faults.drill``) at a seeded point of a job
of bleu and coherence, while a client waits with ``evalq run --broker`` (the failovers under
sentinels: tests/faults/test_sentinel.py). Each ends as ``drill.check_undisturbed`` says: the client's
exit 0, every (instance, entry) once with the value it must have (nltk's BLEU computed directly;
judge-sim's score as the item asks it), the cluster's journal showing no chunk lost and judge calls
paid again within those in flight at the fault, both workers answering ``inspect ping`` after it.
``bench/bench_failover.py`` runs each fault several times."""

from __future__ import annotations

import os

import pytest

from tests.faults import drill

pytestmark = pytest.mark.integration

SEED = int(os.environ.get("EVALQ_DRILL_SEED", "72"))


@pytest.mark.parametrize("fault", ["flushall", "replaced"])
def test_a_night_rides_its_redis_lost_and_ends_as_undisturbed(tmp_path, fault):
    drill.check_undisturbed(drill.run(tmp_path, fault, seed=SEED + drill.FAULTS.index(fault)))
