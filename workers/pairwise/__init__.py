"""The pairwise comparison's implementation (``evalq.shared.pairwise``: its parameters and aggregate)."""
