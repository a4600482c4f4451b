"""``python -m evalq.sim``: the judge simulator on its own."""

import sys

from evalq.sim.cli import main

sys.exit(main())
