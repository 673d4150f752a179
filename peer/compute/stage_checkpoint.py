"""The on-disk form of one stage's state: safetensors weights, the optimizer apart.

    DIR/<run>-stage<K>/it<NNNNNNNN>/model.safetensors   weights, global names (layers.<i>.*,
                                                         embed.*, norm.*, head.*), and in the
                                                         header: run, stage, layers, iteration,
                                                         step and the full model config
    DIR/<run>-stage<K>/it<NNNNNNNN>/optimizer.pt        AdamW state (torch, loaded weights_only)

A version folder is written as a hidden temp folder and renamed into place, so a reader sees
whole versions or none, and replicas of a stage saving into one DIR never mix their files
(they hold identical state: whoever renames first wins, the other's copy is dropped). Export
reads model.safetensors alone; no pickle is needed to get at the weights.

The first format, one `DIR/<run>-stage<K>.pt` per stage, still loads (read_legacy).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from modelconfig import ConfigError, ModelConfig, get_config, spec_model, to_hf_dict

FORMAT = "skippipe-stage/2"
VERSION_RE = re.compile(r"^it(\d{8,})$")
STAGE_DIR_RE = re.compile(r"^(?P<run>.+)-stage(?P<stage>\d+)$")
LEGACY_RE = re.compile(r"^(?P<run>.+)-stage(?P<stage>\d+)\.pt$")
WEIGHTS, OPTIMIZER = "model.safetensors", "optimizer.pt"
STALE_TMP_S = 3600.0


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names the file and the reason."""


@dataclass(frozen=True)
class StageFile:
    """One saved version of one stage: a version folder, or a legacy .pt file."""
    run: str
    stage: int
    iteration: int
    path: Path

    @property
    def legacy(self) -> bool:
        return self.path.suffix == ".pt"


def stage_dir(directory: Path, run: str, stage: int) -> Path:
    return Path(directory) / f"{run}-stage{stage}"


def version_dir(directory: Path, run: str, stage: int, iteration: int) -> Path:
    return stage_dir(directory, run, stage) / f"it{iteration:08d}"


def _global(name: str, start: int) -> str:
    if not name.startswith("layers.blocks."):
        return name
    index, rest = name[len("layers.blocks."):].split(".", 1)
    return f"layers.{start + int(index)}.{rest}"


def _local(name: str, start: int) -> str:
    if not name.startswith("layers."):
        return name
    index, rest = name[len("layers."):].split(".", 1)
    return f"layers.blocks.{int(index) - start}.{rest}"


def config_json(config: ModelConfig) -> str:
    return json.dumps({"name": config.name, **to_hf_dict(config)}, sort_keys=True)


DATA_CURSOR = "data_cursor.json"    # stage 0 only: where the sample cursor stands (tokendata/cursor.py)


def write_version(directory: Path, run: str, config: ModelConfig, state: dict, iteration: int,
                  tokenizer: tuple[str, str] = ("byte", ""), data_cursor: dict | None = None) -> Path | None:
    """Write a runner state (StageRunner.state_dict(): a snapshot) as version `iteration`.

    Returns the version folder, or None when a replica had already written that version.
    """
    start, end = state["layers"]
    final = version_dir(directory, run, state["stage"], iteration)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    tensors = {_global(n, start): t.detach().to("cpu").contiguous() for n, t in state["module"].items()}
    meta = {"format": FORMAT, "run": run, "stage": str(state["stage"]), "layer_start": str(start),
            "layer_end": str(end), "iteration": str(iteration), "step": str(state["step"]),
            "model_config": config_json(config), "tokenizer": tokenizer[0], "tokenizer_hash": tokenizer[1]}
    save_file(tensors, str(tmp / WEIGHTS), metadata=meta)
    torch.save(state["optimizer"], tmp / OPTIMIZER)
    names = [WEIGHTS, OPTIMIZER]
    if data_cursor is not None:   # read by a restarted coordinator (coordinator/data_resume.py)
        (tmp / DATA_CURSOR).write_text(json.dumps(data_cursor))
        names.append(DATA_CURSOR)
    for name in names:                         # the rename must not land before the data does
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())
    try:
        os.rename(tmp, final)
    except OSError:                            # exists: a replica of this stage saved it first
        shutil.rmtree(tmp, ignore_errors=True)
        return None
    return final


def versions(directory: Path, run: str, stage: int) -> list[StageFile]:
    """Complete versions of a stage, oldest first (temp folders are not versions)."""
    folder = stage_dir(directory, run, stage)
    found = []
    if folder.is_dir():
        for p in folder.iterdir():
            m = VERSION_RE.match(p.name)
            if m and (p / WEIGHTS).is_file():
                found.append(StageFile(run, stage, int(m[1]), p))
    return sorted(found, key=lambda f: f.iteration)


def prune(directory: Path, run: str, stage: int, keep_last: int) -> None:
    for old in versions(directory, run, stage)[:-keep_last]:
        shutil.rmtree(old.path, ignore_errors=True)
    cutoff = time.time() - STALE_TMP_S
    for tmp in stage_dir(directory, run, stage).glob(".it*.tmp*"):   # a writer killed mid-save;
        try:                                                         # a replica's live one is young
            if tmp.stat().st_mtime < cutoff:
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass


def read_meta(path: Path) -> dict:
    try:
        with safe_open(str(path / WEIGHTS), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:   # safetensors raises several types for a damaged header
        raise CheckpointError(f"{path / WEIGHTS} is not a readable safetensors file: {exc}") from None
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path / WEIGHTS} is not a skippipe stage checkpoint (format "
                              f"{meta.get('format')!r})")
    return meta


def meta_config(meta: dict, where: Path) -> ModelConfig:
    try:
        data = json.loads(meta["model_config"])
        return spec_model(data.pop("name"), json.dumps(data))
    except (KeyError, ValueError, ConfigError) as exc:
        raise CheckpointError(f"{where}: bad model config in the checkpoint: {exc}") from None


def read_weights(path: Path) -> tuple[dict, ModelConfig, dict[str, torch.Tensor]]:
    """(metadata, model config, global-named tensors) of a version folder; torch, no pickle."""
    from safetensors.torch import load_file
    meta = read_meta(path)
    try:
        tensors = load_file(str(path / WEIGHTS))
    except Exception as exc:
        raise CheckpointError(f"{path / WEIGHTS} cannot be read: {exc}") from None
    return meta, meta_config(meta, path), tensors


def read_runner_state(f: StageFile) -> dict:
    """A StageRunner.state_dict()-shaped dict from either format (for load_state_dict)."""
    if f.legacy:
        return read_legacy(f.path)["runner"]
    meta, config, tensors = read_weights(f.path)
    start = int(meta["layer_start"])
    try:
        optimizer = torch.load(f.path / OPTIMIZER, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{f.path / OPTIMIZER} cannot be read: {exc}") from None
    return {"format": 1, "model_name": config.name, "stage": int(meta["stage"]),
            "layers": (start, int(meta["layer_end"])), "step": int(meta["step"]),
            "module": {_local(n, start): t for n, t in tensors.items()}, "optimizer": optimizer}


def read_legacy(path: Path) -> dict:
    try:
        # weights_only: a checkpoint file is data, never code
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # junk bytes fail inside the unpickler in many ways (KeyError: 174812789, ...)
        raise CheckpointError(f"{path} is not a stage checkpoint (torch cannot read it; it should be a file "
                              f"that skippipe-peer --checkpoint-dir wrote)") from None
    try:
        state["runner"]["module"], int(state["iteration"])
    except Exception as exc:
        raise CheckpointError(f"{path} is not a usable stage checkpoint: {type(exc).__name__}: {exc}") from None
    return state


def legacy_file(directory: Path, run: str, stage: int) -> StageFile | None:
    path = Path(directory) / f"{run}-stage{stage}.pt"
    if not path.is_file():
        return None
    try:
        iteration = int(read_legacy(path)["iteration"])
    except CheckpointError:
        iteration = -1
    return StageFile(run, stage, iteration, path)


def legacy_config(state: dict) -> ModelConfig:
    """The first format named only a preset."""
    try:
        return get_config(state["model_name"])
    except KeyError as exc:
        raise CheckpointError(f"unknown model {state.get('model_name')!r} in a .pt checkpoint: {exc}") from None


def find_run(directory: Path, run: str | None = None) -> tuple[str, dict[int, StageFile]]:
    """The run in `directory` and, per stage, the version to use: the newest iteration that
    every stage has (replicas save in step), else each stage's newest. One-line errors name
    what is missing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"--checkpoint {directory} is not a folder")
    found: dict[str, dict[int, list[StageFile]]] = {}
    for p in directory.iterdir():
        m = STAGE_DIR_RE.match(p.name) if p.is_dir() else LEGACY_RE.match(p.name)
        if m:
            name, stage = m["run"], int(m["stage"])
            files = versions(directory, name, stage) if p.is_dir() else [StageFile(name, stage, -1, p)]
            if files:
                found.setdefault(name, {}).setdefault(stage, []).extend(files)
    if not found:
        raise CheckpointError(f"no stage checkpoints (<run>-stage<K>/it<N>/ or <run>-stage<K>.pt) in {directory}")
    if run is None:
        if len(found) > 1:
            raise CheckpointError(f"{directory} holds several runs ({', '.join(sorted(found))}); pick one with --run")
        run = next(iter(found))
    if run not in found:
        raise CheckpointError(f"no checkpoints of run {run!r} in {directory} (found: {', '.join(sorted(found))})")
    stages = found[run]
    missing = sorted(set(range(max(stages) + 1)) - set(stages))
    if missing:
        raise CheckpointError(f"run {run!r} in {directory} lacks stage(s) {', '.join(map(str, missing))} "
                              f"(found stages {', '.join(map(str, sorted(stages)))}): every stage 0..S-1 is needed")
    new = {s: [f for f in files if not f.legacy] for s, files in stages.items()}
    if all(new.values()):
        common = set.intersection(*({f.iteration for f in fs} for fs in new.values()))
        if common:
            it = max(common)
            return run, {s: next(f for f in fs if f.iteration == it) for s, fs in new.items()}
        return run, {s: fs[-1] for s, fs in new.items()}
    return run, {s: (new[s] or files)[-1] for s, files in stages.items()}


def recorded_tokenizer(directory: Path, run: str | None = None) -> tuple[str, str] | None:
    """(name, sha256) of the tokenizer the run trained with, as its stage-0 checkpoint records
    it; None for checkpoints that predate the record (.pt, or no such header)."""
    _, files = find_run(directory, run)
    f = files[0]
    if f.legacy:
        return None
    meta = read_meta(f.path)
    return (meta["tokenizer"], meta.get("tokenizer_hash", "")) if meta.get("tokenizer") else None


def load_stage_module(f: StageFile):
    """A StageModule (eval mode) holding the weights of one saved stage version."""
    from peer.compute.stages import StageModule
    if f.legacy:
        state = read_legacy(f.path)["runner"]
        config, start_end, module_state = legacy_config(state), tuple(state["layers"]), state["module"]
        stage = state.get("stage")
    else:
        meta, config, tensors = read_weights(f.path)
        start_end = (int(meta["layer_start"]), int(meta["layer_end"]))
        module_state = {_local(n, start_end[0]): t for n, t in tensors.items()}
        stage = int(meta["stage"])
    if stage != f.stage:
        raise CheckpointError(f"{f.path} says it is stage {stage}, its name says {f.stage}")
    try:
        module = StageModule(config, f.stage, start_end, seed=0)
        module.load_state_dict(module_state, strict=True)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{f.path} does not fit its own model config: {exc}") from None
    return module.eval()


def load_stage_modules(directory: Path, run: str | None = None):
    """(run, [StageModule per stage], iteration) of a checkpoint folder; the stages must tile
    the model's layers exactly (a folder missing its last stage is caught here)."""
    run, files = find_run(directory, run)
    stages = [load_stage_module(files[s]) for s in range(len(files))]
    config = stages[0].config
    if any(s.config != config for s in stages):
        raise CheckpointError(f"run {run!r}: the stages in {directory} disagree on the model config")
    expected = 0
    for s in stages:
        if s.layer_start != expected:
            raise CheckpointError(f"run {run!r}: stage {s.stage} starts at layer {s.layer_start}, expected {expected}")
        expected = s.layer_end
    if expected != config.n_layers:
        raise CheckpointError(f"run {run!r} in {directory} lacks its last stage(s): the stages found end at layer "
                              f"{expected} of {config.n_layers}")
    return run, stages, max(f.iteration for f in files.values())
