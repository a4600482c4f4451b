"""``python -m evalq.cli``: the evalq command."""

from evalq.cli import main

main()
