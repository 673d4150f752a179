"""Getting the run's training data onto this peer before it trains as stage 0, and serving it
to others afterwards (tokendata/transfer.py): a volunteer needs no dataset of its own."""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import numpy as np

from protocol.messages import RunSpec

from peer.config import PeerConfig
from peer.samples import SampleSource
from peer.training_data import DataMismatch, MANIFEST, corpus_samples, dataset_samples, is_dataset_folder

from tokendata.transfer import DataServer, Downloader, TransferError

logger = logging.getLogger("skippipe.peer")
MAX_MANIFEST_BYTES = 16 * 2**20


async def prepare_samples(spec: RunSpec, config: PeerConfig, p2p, holders: list[str]) -> SampleSource:
    """The run's training samples: from --data, the cache, or downloaded. Serves the dataset on
    `p2p` once it is here and verified. Raises DataMismatch (one line) when it cannot."""
    if not spec.dataset_id:
        return await asyncio.to_thread(corpus_samples, spec, config.data)
    if is_dataset_folder(config.data):
        folder = Path(config.data)
        samples = await asyncio.to_thread(dataset_samples, spec, folder)
    else:
        if config.data is not None:
            raise DataMismatch(f"--data {config.data} has no {MANIFEST}: run {spec.run!r} trains on dataset "
                               f"{spec.dataset_id}; leave --data out to download it")
        folder = Path(config.cache_dir) / "datasets" / spec.dataset_id
        try:
            await download_dataset(spec, p2p, holders, folder)
        except TransferError as exc:
            raise DataMismatch(f"cannot download dataset {spec.dataset_id}: {exc}") from None
        samples = await asyncio.to_thread(dataset_samples, spec, folder, False)  # hashes checked on arrival
    await serve_dataset(p2p, spec.dataset_id, folder)
    return samples


async def download_dataset(spec: RunSpec, p2p, holders: list[str], folder: Path) -> None:
    from tokendata.manifest import DatasetError, manifest_from_json
    fetch = Downloader(p2p, spec.dataset_id, holders, folder)
    text = (await fetch.fetch_bytes(MANIFEST, MAX_MANIFEST_BYTES)).decode("utf-8", errors="replace")
    try:
        manifest = manifest_from_json(text)
    except DatasetError as exc:
        raise TransferError(f"the manifest a holder sent is unusable: {exc}") from None
    if manifest.dataset_id != spec.dataset_id:  # the id is recomputed from the contents
        raise TransferError(f"a holder sent the manifest of dataset {manifest.dataset_id}, not {spec.dataset_id}")
    itemsize = np.dtype(manifest.dtype).itemsize
    total = sum(s.tokens for s in manifest.shards) * itemsize
    logger.info("downloading dataset %s: %d shards, %.1f MiB, from %d holder(s)", spec.dataset_id,
                len(manifest.shards), total / 2**20, len(holders))
    for shard in manifest.shards:   # the small validation shard too: a complete folder evaluates
        await fetch.fetch_file(shard.file, shard.sha256, shard.tokens * itemsize)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).write_text(text)   # last: a folder with a manifest is complete


async def serve_dataset(p2p, dataset_id: str, folder: Path) -> DataServer:
    from tokendata.manifest import read_manifest
    manifest = read_manifest(folder)
    files = {MANIFEST: folder / MANIFEST}
    files.update({s.file: folder / s.file for s in manifest.shards if (folder / s.file).exists()})
    server = DataServer(dataset_id, files)
    await server.attach(p2p)
    return server
