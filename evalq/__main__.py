"""``python -m evalq``: the same as the ``evalq`` command."""

from evalq.cli import main

if __name__ == "__main__":
    main()
