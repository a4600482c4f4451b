"""The cluster's state and who shares it: Redis keys (``keys``), leases (``leases``), job status
(``status``), the stored spec of a job and its chunks (``spec``), tenants, priorities and windows
(``scheduling``), tenants' Redis ACL users (``tenant_acl``) and Prometheus counters
(``telemetry``).

May import: core, scores. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to
its list.)
"""
