"""A module a job must not be able to make evalq import: importing it leaves a
mark (the file named by EVALQ_TEST_EVIL_MARK), as arbitrary code would."""

import os
from pathlib import Path

if os.environ.get("EVALQ_TEST_EVIL_MARK"):
    Path(os.environ["EVALQ_TEST_EVIL_MARK"]).write_text("imported")


class Runner:
    def predict(self, prompt):
        return prompt, None
