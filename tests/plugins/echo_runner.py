"""A test ModelRunner (fmeval's interface), loaded by name from a job's
``model.runner``: it answers with the prompt's last word, upper-cased, and a
log probability of minus the prompt's length."""

from __future__ import annotations

from evalq.shared.model.runners import ModelRunner


class LastWordRunner(ModelRunner):
    def __init__(self, suffix: str = ""):
        if suffix == "FAIL":
            raise ValueError("this runner refuses suffix FAIL")
        self.suffix = suffix

    def predict(self, prompt: str) -> tuple[str | None, float | None]:
        words = prompt.split()
        if words and words[-1] == "NOTHING":
            return None, None
        return (words[-1].upper() + self.suffix if words else ""), -float(len(prompt))


class EchoRunner(ModelRunner):
    """Answers with the prompt itself (jailbreak tests: the injection reaches the answer)."""

    def predict(self, prompt: str) -> tuple[str, None]:
        return prompt, None


class SlowLowerRunner(ModelRunner):
    """Answers with the prompt lower-cased, after ``seconds`` (a model worth killing mid-job)."""

    def __init__(self, seconds: float = 0.02):
        self.seconds = seconds

    def predict(self, prompt: str) -> tuple[str, None]:
        import time

        time.sleep(self.seconds)
        return prompt.lower(), None
