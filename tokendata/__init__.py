"""Token data shared by the peer and the coordinator: tokenizers, dataset shards and manifest, the sample cursor."""
