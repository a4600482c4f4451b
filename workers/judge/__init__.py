"""The judge layer: budgeted, cached, retried chat-completion calls.

Metric functions receive a ``JudgeClient`` and stay pure; everything about
quotas, caching and retries lives here.
"""
