"""StageRunner: one stage's module, optimizer and activation stash.

Stash choice: an entry keeps the stage's input (a leaf with requires_grad) and its output
*with the autograd graph*, so backward is a single `output.backward(grad)`; no recomputation.
Memory is bounded by `max_stash` entries (the planner's per-node memory limit, TC1) and by a
TTL so that microbatches whose backward never comes do not leak.

Gradient normalisation: gradients of each microbatch are accumulated as the gradient of the
*sum over its samples* of the per-sample mean token loss; `step()` divides by the number of
samples whose backward actually reached this stage (after replica averaging, by the total over
the replicas: see grad_vector / set_grad_vector). A stage skipped by some microbatches is
therefore averaged over the microbatches that visited it, never over the replica count.

At the origin, head_loss computes the head's gradients but holds them in the stash entry until
backward_origin, so a microbatch contributes to all of stage 0's parameters or to none.

Not re-entrant across threads by design, but guarded by a lock so a stray concurrent call
cannot corrupt the stash. Tensors returned are detached; do not modify them in place.
"""
from __future__ import annotations

import contextlib
import copy
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from peer.compute.flat import flatten, split_like
from peer.compute.errors import BadTensor, OutOfOrder, StashFull, UnknownMicrobatch, WrongStage
from peer.compute.host_buffers import DeviceIO
from peer.compute.input_checks import checked_hidden, checked_tokens
from peer.compute.model import spec_config
from peer.compute.optim import OptimConfig, StepStats  # noqa: F401  (StepStats: re-exported)
from peer.compute.stages import StageModule, build_stage
from protocol.messages import RunSpec

Key = tuple[int, int]                 # (iteration, microbatch_id)


@dataclass
class _Entry:
    created: float
    samples: int
    input: torch.Tensor               # leaf requiring grad (non-origin) or tokens (origin)
    output: torch.Tensor              # carries the graph
    head_grads: tuple[torch.Tensor, ...] | None = None
    loss: float | None = None


class StageRunner:
    def __init__(self, module: StageModule, optim: OptimConfig = OptimConfig(), *,
                 max_stash: int = 16, stash_ttl_s: float = 300.0, device: str | torch.device = "cpu",
                 clock: Callable[[], float] = time.monotonic,
                 autocast_dtype: torch.dtype | None = None, io: DeviceIO | None = None):
        if max_stash < 1:
            raise ValueError("max_stash must be >= 1")
        self.device = torch.device(device)
        self.module = module.to(self.device)
        self.config = module.config
        self.optim_config = optim
        self.max_stash, self.stash_ttl_s, self.clock = max_stash, stash_ttl_s, clock
        self.autocast_dtype = autocast_dtype
        self.io = io                  # None: tensors in/out as is (fp32 on the device); see host_buffers
        self.dtype = next(module.parameters()).dtype
        self._params = list(module.parameters())
        decay = [p for p in self._params if p.ndim >= 2]
        no_decay = [p for p in self._params if p.ndim < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": optim.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=optim.lr_at(0), betas=optim.betas, eps=optim.eps)
        self._stash: dict[Key, _Entry] = {}
        self._lock = threading.RLock()
        self.step_count = 0
        self.samples_this_step = 0
        self._microbatches = 0
        self._loss_sum, self._loss_count = 0.0, 0

    @classmethod
    def from_spec(cls, spec: RunSpec, stage: int, on_layer=None, **kwargs) -> StageRunner:
        module = build_stage(spec_config(spec), stage, spec.num_stages, spec.seed,
                             spec.stage_sizes, on_layer)
        return cls(module, OptimConfig.from_spec(spec), **kwargs)

    @property
    def is_origin(self) -> bool:
        return self.module.is_origin

    @property
    def stashed(self) -> int:
        return len(self._stash)

    def stash_keys(self) -> list[Key]:
        return list(self._stash)

    # ---- validation (runs before any state changes) ----

    def _check_key(self, key) -> Key:
        if (not isinstance(key, tuple) or len(key) != 2
                or not all(isinstance(k, int) and k >= 0 for k in key)):
            raise ValueError(f"key must be (iteration, microbatch_id) of non-negative ints: {key!r}")
        return key

    def _check_float(self, what: str, t, shape: tuple[int, ...] | None) -> torch.Tensor:
        return checked_hidden(what, t, shape, self.config, self.dtype, self.io, self.device)

    def _check_tokens(self, what: str, t, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        return checked_tokens(what, t, shape, self.config, self.device)

    def _require_origin(self, call: str, origin: bool = True) -> None:
        if self.is_origin != origin:
            where = "stage 0 (origin)" if origin else "a stage other than 0"
            raise WrongStage(f"{call} runs only on {where}; this runner holds stage "
                             f"{self.module.stage}")

    def _entry(self, key: Key) -> _Entry:
        entry = self._stash.get(key)
        if entry is None:
            raise UnknownMicrobatch(f"no stashed activations for microbatch {key} on stage "
                                    f"{self.module.stage} (never seen, expired or dropped)")
        return entry

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast_dtype)

    def _out(self, t: torch.Tensor, grad: bool = False) -> torch.Tensor:
        return t.detach() if self.io is None else self.io.to_host(t, grad)

    def _admit(self, key: Key) -> None:
        self.evict_expired()
        if key in self._stash:
            raise OutOfOrder(f"microbatch {key} is already stashed on stage {self.module.stage}")
        if len(self._stash) >= self.max_stash:
            raise StashFull(f"stage {self.module.stage} already holds {len(self._stash)} "
                            f"microbatches (max {self.max_stash})")

    def _store(self, key: Key, inp: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        if not bool(torch.isfinite(out).all()):
            raise BadTensor("stage output", "non-finite (diverged weights?)", non_finite=True)
        self._stash[key] = _Entry(self.clock(), inp.shape[0], inp, out)
        return self._out(out)

    # ---- forward ----

    def forward(self, key: Key, hidden: torch.Tensor) -> torch.Tensor:
        """Non-origin stage: run this stage's layers, stash for backward, return the output."""
        with self._lock:
            self._require_origin("forward", origin=False)
            key = self._check_key(key)
            x = self._check_float(f"activation for {key}", hidden, None)
            self._admit(key)
            inp = x.detach().requires_grad_(True)
            with torch.enable_grad(), self._autocast():
                out = self.module(inp)
            return self._store(key, inp, out)

    def recompute(self, hidden: torch.Tensor, step: int, grad_output: torch.Tensor | None = None
                  ) -> torch.Tensor | None:
        """Spot check (peer/pipeline/spot_checks.py): this stage's forward, nothing stashed, with
        the parameters as they were after `step` steps; None if the optimizer has moved on. With
        `grad_output`: the backward's input gradient instead, as backward() returns it (no
        parameter gradient is kept; peer/pipeline/backward_checks.py)."""
        with self._lock:  # also orders it against step(): the parameters cannot change mid-way
            self._require_origin("recompute", origin=False)
            if self.step_count != step:
                return None
            x = self._check_float("spot-check activation", hidden, None)
            if grad_output is None:
                with torch.no_grad(), self._autocast():
                    return self._out(self.module(x))
            g = self._check_float("spot-check gradient", grad_output, tuple(x.shape))
            inp = x.detach().requires_grad_(True)
            with torch.enable_grad(), self._autocast():
                out = self.module(inp)
            (grad_input,) = torch.autograd.grad(out, [inp], g)
            return self._out(grad_input, grad=True)

    def forward_origin(self, key: Key, tokens: torch.Tensor) -> torch.Tensor:
        """Stage 0: embed the tokens and run stage 0's layers; returns the hidden state."""
        with self._lock:
            self._require_origin("forward_origin")
            key = self._check_key(key)
            tok = self._check_tokens(f"tokens for {key}", tokens)
            self._admit(key)
            with torch.enable_grad(), self._autocast():
                out = self.module(self.module.embed_tokens(tok))
            return self._store(key, tok, out)

    def head_loss(self, key: Key, hidden: torch.Tensor, targets: torch.Tensor,
                  replace: bool = False) -> tuple[float, torch.Tensor]:
        """Stage 0: final norm + head + loss on the returning hidden state.

        Returns (mean token loss, gradient w.r.t. `hidden`) where the gradient is that of
        loss * batch (sum over samples); head gradients wait in the stash for backward_origin.
        """
        with self._lock:
            self._require_origin("head_loss")
            key = self._check_key(key)
            entry = self._entry(key)
            if entry.head_grads is not None and not replace:  # replace: a replayed attempt
                raise OutOfOrder(f"head_loss for {key} was already computed")
            shape = tuple(entry.output.shape)
            h = self._check_float(f"returning activation for {key}", hidden, shape)
            tgt = self._check_tokens(f"targets for {key}", targets, shape[:2])
            h = h.detach().requires_grad_(True)
            with torch.enable_grad(), self._autocast():
                loss = self.module.head_loss(h, tgt)
            if not bool(torch.isfinite(loss.detach())):
                raise BadTensor(f"loss for {key}", "non-finite", non_finite=True)
            grads = torch.autograd.grad(loss * shape[0], [h, *self.module.head_parameters()])
            entry.head_grads, entry.loss = tuple(grads[1:]), loss.item()
            return entry.loss, self._out(grads[0], grad=True)

    # ---- backward ----

    def backward(self, key: Key, grad_output: torch.Tensor, accumulate: bool = True) -> torch.Tensor:
        """Non-origin stage: backpropagate; accumulates parameter grads; returns grad_input.
        accumulate=False only passes the gradient on (a replayed microbatch this stage
        already counted: its parameters must not get that microbatch's gradient twice)."""
        with self._lock:
            self._require_origin("backward", origin=False)
            key = self._check_key(key)
            entry = self._entry(key)
            g = self._check_float(f"gradient for {key}", grad_output, tuple(entry.output.shape))
            del self._stash[key]
            if not accumulate:
                (grad_input,) = torch.autograd.grad(entry.output, [entry.input], g)
                return self._out(grad_input, grad=True)
            entry.output.backward(g)
            self._count(entry)
            return self._out(entry.input.grad, grad=True)

    def stashed_output(self, key: Key) -> torch.Tensor:
        """The output a stashed microbatch produced, to send it again on another route."""
        with self._lock:
            return self._out(self._entry(self._check_key(key)).output)

    def backward_origin(self, key: Key, grad: torch.Tensor) -> None:
        """Stage 0: add the held head grads and backpropagate into stage-0 layers + embedding."""
        with self._lock:
            self._require_origin("backward_origin")
            key = self._check_key(key)
            entry = self._entry(key)
            if entry.head_grads is None:
                raise OutOfOrder(f"backward_origin for {key} before its head_loss")
            g = self._check_float(f"gradient for {key}", grad, tuple(entry.output.shape))
            del self._stash[key]
            for p, hg in zip(self.module.head_parameters(), entry.head_grads):
                p.grad = hg.clone() if p.grad is None else p.grad.add_(hg)
            entry.output.backward(g)
            self._count(entry)
            self._loss_sum += entry.loss
            self._loss_count += 1

    def _count(self, entry: _Entry) -> None:
        self.samples_this_step += entry.samples
        self._microbatches += 1

    # ---- stash housekeeping ----

    def drop(self, key: Key) -> bool:
        """Discard a stash entry (its microbatch was abandoned); True if there was one."""
        with self._lock:
            return self._stash.pop(key, None) is not None

    def evict_expired(self, now: float | None = None) -> list[Key]:
        """Drop entries older than stash_ttl_s; returns their keys."""
        with self._lock:
            now = self.clock() if now is None else now
            old = [k for k, e in self._stash.items() if now - e.created > self.stash_ttl_s]
            for k in old:
                del self._stash[k]
            return old

    # ---- optimizer step ----

    def step(self) -> StepStats:
        """Normalise grads by samples seen, clip, AdamW with warm-up, zero grads.

        Also discards every stash entry: after the in-place update their graphs are stale.
        With no samples the parameters are left alone (skipped=True) but the step count and
        warm-up still advance, so replicas that agree on the schedule stay in lockstep.
        """
        with self._lock:
            step, lr = self.step_count, self.optim_config.lr_at(self.step_count)
            samples, norm, skipped = self.samples_this_step, 0.0, True
            if samples > 0:
                for p in self._params:
                    if p.grad is not None:
                        p.grad.div_(samples)
                max_norm = self.optim_config.max_grad_norm
                norm = float(torch.nn.utils.clip_grad_norm_(
                    self._params, max_norm if max_norm > 0 else math.inf))
                skipped = not math.isfinite(norm)
                if not skipped:
                    for group in self.optimizer.param_groups:
                        group["lr"] = lr
                    self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            stats = StepStats(step, lr, samples, self._microbatches, norm, skipped,
                              self._loss_sum / self._loss_count if self._loss_count else None,
                              len(self._stash))
            self._stash.clear()
            self.step_count += 1
            self.samples_this_step, self._microbatches = 0, 0
            self._loss_sum, self._loss_count = 0.0, 0
            return stats

    def abandon(self) -> None:
        """Forget this iteration's gradients and stash without stepping (we were cut off
        mid-iteration: the replicas stepped without us, or will re-send the work)."""
        with self._lock:
            self.optimizer.zero_grad(set_to_none=True)
            self._stash.clear()
            self.samples_this_step, self._microbatches = 0, 0
            self._loss_sum, self._loss_count = 0.0, 0

    # ---- replica averaging and checkpoints ----

    def grad_vector(self) -> torch.Tensor:
        """Flat float32 vector of the *accumulated* (un-normalised, summed) gradients.

        Replica averaging: sum grad_vector() and samples_this_step over the replicas, then
        set_grad_vector(sum, total_samples) on each before step().
        """
        with self._lock:
            return flatten(p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params)

    def set_grad_vector(self, vector: torch.Tensor, samples: int) -> None:
        with self._lock:
            n = self.num_parameters()
            if not isinstance(vector, torch.Tensor) or vector.ndim != 1 or vector.numel() != n:
                raise BadTensor("gradient vector", f"expected a 1-D tensor of {n} elements")
            if not vector.is_floating_point() or not bool(torch.isfinite(vector).all()):
                raise BadTensor("gradient vector", "not finite floating point", non_finite=True)
            if not isinstance(samples, int) or samples < 0:
                raise ValueError(f"samples must be a non-negative int: {samples!r}")
            for p, chunk in zip(self._params, split_like(vector, self._params)):
                p.grad = chunk.to(device=p.device, dtype=p.dtype).clone()
            self.samples_this_step = samples

    def parameter_vector(self) -> torch.Tensor:
        with self._lock:
            return flatten(self._params)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self._params)

    def state_dict(self) -> dict:
        """A snapshot (deep copy): training may go on while it is being written out."""
        with self._lock:
            m = self.module
            return copy.deepcopy({
                "format": 1, "model_name": self.config.name, "stage": m.stage,
                "layers": (m.layer_start, m.layer_end), "step": self.step_count,
                "module": m.state_dict(), "optimizer": self.optimizer.state_dict()})

    def load_state_dict(self, state: dict) -> None:
        """Load params + optimizer (checkpoint or late-join); clears stash and grads."""
        with self._lock:
            m = self.module
            want = (self.config.name, m.stage, (m.layer_start, m.layer_end))
            got = (state.get("model_name"), state.get("stage"), tuple(state.get("layers", ())))
            if state.get("format") != 1 or got != want:
                raise ValueError(f"state is for (model, stage, layers) {got}, this runner is {want}")
            m.load_state_dict(state["module"], strict=True)
            # AdamW would alias the given moment tensors; copy so the source stays independent.
            self.optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
            self.step_count = int(state["step"])
            self._stash.clear()
            self.optimizer.zero_grad(set_to_none=True)
            self.samples_this_step, self._microbatches = 0, 0
            self._loss_sum, self._loss_count = 0.0, 0
