"""Model runners evalq ships for the model under test (``model.runner``), registered under the
``evalq.model_runners`` entry point so a job may name them."""
