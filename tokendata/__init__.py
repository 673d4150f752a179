"""Tokenizers and token datasets, shared by peer/ and coordinator/ (torch-free: numpy,
Hugging Face `tokenizers`, `regex`, pyarrow and the stdlib only).

    tokenizer  the byte and BPE tokenizers (Hugging Face tokenizer.json), their identity hash
    readers    streaming documents out of .txt / .jsonl / .jsonl.gz / .parquet inputs
    fastpath   exact shortcuts for encoding whole batches (byte ids, cached BPE words)
    writer     shard files hashed as written; the train/validation split of the token stream
    build      input files -> token shards + validation shard + dataset.json (worker processes)
    manifest   dataset.json: read, write, verify
    shards     TokenDataset: reproducible batches from memory-mapped shards
    progress   'N MB (X MB/s)' on stderr
    make_bpe   regenerates the shipped BPE tokenizer (assets/bpe.json)
"""
