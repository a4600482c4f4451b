"""evalq on a Sentinel-managed Redis (issue 72): the ``sentinel://`` form Celery documents, read as
its hosts, credentials and database; and a night through its primary's failovers, drilled on a
primary, a replica and three sentinels (``tests.faults.drill``): ``SENTINEL FAILOVER`` with the old
primary kept as a replica (the READONLY path), the primary SIGKILLed, and the primary cut off in a
network namespace past down-after-milliseconds, then healed (needs root). Each ends as undisturbed,
and every worker answers ``inspect ping`` after it."""

from __future__ import annotations

import os

import pytest

from tests.faults import drill

SEED = int(os.environ.get("EVALQ_DRILL_SEED", "72"))


@pytest.mark.integration
@pytest.mark.parametrize("fault", ["failover", "killed", "partition"])
def test_a_night_rides_a_failover_of_its_primary_and_ends_as_undisturbed(tmp_path, fault):
    if fault == "partition" and drill.can_partition():
        pytest.skip(drill.can_partition())
    drill.check_undisturbed(drill.run(tmp_path, fault, seed=SEED + drill.FAULTS.index(fault)))


def test_a_sentinel_url_reads_as_its_hosts_credentials_and_database(monkeypatch):
    from evalq.shared.core.config import is_sentinel, safe_url, sentinel_master, sentinel_parts

    url = "sentinel://:s%40cret@10.0.0.1:26379/2;sentinel://10.0.0.2:26380;sentinel://10.0.0.3"
    assert is_sentinel(url) and not is_sentinel("redis://h:6379")
    assert sentinel_parts(url) == ([("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379)], None,
                                   "s@cret", 2)
    assert "s%40cret" not in safe_url(url) and "10.0.0.1" in safe_url(url)
    monkeypatch.delenv("EVALQ_SENTINEL_MASTER", raising=False)
    assert sentinel_master() == "mymaster"
    monkeypatch.setenv("EVALQ_SENTINEL_MASTER", "night")
    assert sentinel_master() == "night"
    assert sentinel_parts("sentinel://u:p@h:1") == ([("h", 1)], "u", "p", 0)
