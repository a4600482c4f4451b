"""What the operator lets jobs reach: the endpoints each key may be sent to (``endpoints``), and the
S3 places, S3 endpoints and local roots the cluster may read and write for a request, a tenant's
part of them included (``egress``).

May import: core. (``tests/unit/test_layers.py`` holds every room of ``evalq.shared`` to
its list.)
"""
