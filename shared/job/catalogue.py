"""Every metric a job may name, registered: evalq's own (``evalq.shared.metrics.builtin``), each
family's (fmeval's algorithms, agents), and the modules the operator loads with ``EVALQ_PLUGINS``.
Import this module (not a family's) wherever a job is read or a metric is looked up by name."""

from __future__ import annotations

import evalq.shared.metrics.builtin  # noqa: F401  (evalq's own metrics)
import evalq.shared.fmeval.catalogue  # noqa: E402,F401  (fmeval's algorithms: a family of their own)
import evalq.shared.agents.catalogue  # noqa: E402,F401  (agents' trajectories: another)
import evalq.shared.pairwise.catalogue  # noqa: E402,F401  (two answers compared by a judge: another)


def load_plugins() -> None:
    """Import the modules named in ``EVALQ_PLUGINS`` (comma-separated); each
    registers its own metrics. The orchestrator and every worker must see the
    same value, so a cluster's workers are started with it too."""
    import importlib
    import os

    for name in filter(None, (m.strip() for m in os.environ.get("EVALQ_PLUGINS", "").split(","))):
        importlib.import_module(name)


load_plugins()
