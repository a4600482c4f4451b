"""Model runners evalq ships for the model under test (``model.runner``). A job may name one only
where the operator loaded its module (``EVALQ_PLUGINS=evalq.workers.runners.hf``): a runner loads a
model from local files onto the worker, which is the operator's to allow, not a job's."""
