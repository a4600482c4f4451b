"""BERTScore on the gpu queue: ``metric`` (the registry's batch function, idf ``prepare``, ``warm``),
``models`` (the per-process model cache), ``engine`` (evalq's engine: bert_score's numbers at the
device's pace) and ``native`` (a plain BERT and its tokenizer without transformers)."""
