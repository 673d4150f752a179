"""Tokenizers and token datasets, shared by peer/ and coordinator/ (torch-free: numpy,
Hugging Face `tokenizers`, pyarrow and the stdlib only).

    tokenizer  the byte and BPE tokenizers (Hugging Face tokenizer.json), their identity hash
    readers    streaming documents out of .txt / .jsonl / .jsonl.gz / .parquet inputs
    build      input files -> token shards + validation shard + dataset.json
    manifest   dataset.json: read, write, verify
    shards     TokenDataset: reproducible batches from memory-mapped shards
"""
