"""A stage's full training state as one flat float32 vector, for late-join state transfer.

Layout: [parameters | AdamW exp_avg | AdamW exp_avg_sq], each in parameter order, plus two
integers sent beside it (the runner's step count, which drives warm-up, and AdamW's step).
A flat vector travels in plain chunks: no pickled objects ever come from a peer.
"""
import torch

from peer.compute.flat import split_like
from peer.compute.runner import StageRunner


def flat_state(runner: StageRunner) -> tuple[torch.Tensor, int, int]:
    with runner._lock:
        params = list(runner._params)
        parts, adam_step = [p.detach().reshape(-1).float() for p in params], 0
        for key in ("exp_avg", "exp_avg_sq"):
            for p in params:
                s = runner.optimizer.state.get(p, {})
                parts.append(s[key].detach().reshape(-1).float() if key in s else torch.zeros(p.numel()))
        for p in params:
            s = runner.optimizer.state.get(p, {})
            if "step" in s:
                adam_step = int(s["step"])
        return torch.cat(parts).clone(), runner.step_count, adam_step


def state_size(runner: StageRunner) -> int:
    return 3 * runner.num_parameters()


def load_flat_state(runner: StageRunner, vector: torch.Tensor, step_count: int, adam_step: int) -> None:
    n = runner.num_parameters()
    if vector.ndim != 1 or vector.numel() != 3 * n or not bool(torch.isfinite(vector).all()):
        raise ValueError(f"a stage state must be a finite vector of {3 * n} elements")
    if step_count < 0 or adam_step < 0:
        raise ValueError("step counts must be >= 0")
    if adam_step > step_count:
        raise ValueError(f"AdamW's step {adam_step} is past the stage's step count {step_count}")
    if bool((vector[2 * n:] < 0).any()):      # sqrt of a negative second moment: NaN after one step
        raise ValueError("AdamW's second moments must be >= 0")
    if adam_step == 0 and bool(vector[n:].any()):
        raise ValueError("optimizer moments without an optimizer step")
    with runner._lock:
        params = list(runner._params)
        chunks = split_like(vector, params * 3)     # parameters, exp_avg, exp_avg_sq
        with torch.no_grad():
            for p, c in zip(params, chunks[:len(params)]):
                p.copy_(c.to(dtype=p.dtype, device=p.device))
        runner.optimizer.state.clear()
        if adam_step > 0:
            for i, p in enumerate(params):
                runner.optimizer.state[p] = {
                    "step": torch.tensor(float(adam_step)),
                    "exp_avg": chunks[len(params) + i].to(device=p.device, dtype=p.dtype).clone(),
                    "exp_avg_sq": chunks[2 * len(params) + i].to(device=p.device, dtype=p.dtype).clone()}
        runner.step_count = step_count
        runner._stash.clear()
        runner.optimizer.zero_grad(set_to_none=True)
        runner.samples_this_step = 0
