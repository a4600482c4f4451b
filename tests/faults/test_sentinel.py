"""Sentinel URLs (issue 72): the ``sentinel://`` form Celery documents, read as its hosts,
credentials and database. The failovers themselves are drilled with real sentinels in
tests/faults/test_redis_loss.py (``tests.faults.drill``)."""

from __future__ import annotations


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
