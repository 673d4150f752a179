"""Byte vs BPE tokens (issue 21): the same model, swarm, steps and sequence length, trained once
with each tokenizer on the embedded corpus; then held-out bits per byte (comparable across
tokenizers: total loss in bits over the bytes of the held-out text) and training tokens/s.

Each run is a real `skippipe-swarm` (peers as processes, hivemind P2P on 127.0.0.1) that saves
checkpoints; the held-out text is the corpus's last 4% of bytes, which neither run trained on
(each trains on the first 95% of its own tokens).

  python bench/tokenizer.py [--steps 40] [--peers 4] [--stages 2] [--seq-len 64] [--model tiny]
Last line: RESULT bpb_byte=<n> bpb_bpe=<n> tokens_per_s_byte=<n> tokens_per_s_bpe=<n> bytes_per_token_bpe=<n>
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

HELD_OUT_FRACTION = 0.04


def train(tokenizer: str, args, folder: Path) -> dict:
    summary = folder / f"{tokenizer}.json"
    cmd = [sys.executable, "-m", "launcher", "--peers", str(args.peers), "--stages", str(args.stages),
           "--steps", str(args.steps), "--skip", args.skip, "--model", args.model, "--seq-len", str(args.seq_len),
           "--tokenizer", tokenizer, "--checkpoint-dir", str(folder / f"ckpt-{tokenizer}"), "--save-every",
           str(args.steps), "--summary-json", str(summary), "--status-port", "off", "--run", f"tok-{tokenizer}",
           "--timeout", str(args.timeout)]
    print(f"training with the {tokenizer} tokenizer: {' '.join(cmd[1:])}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 120)
    if proc.returncode != 0:
        sys.exit(f"the {tokenizer} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    result = json.loads(summary.read_text())
    result["wall_s"] = time.monotonic() - t0
    return result


def held_out_bits_per_byte(tokenizer: str, checkpoint: Path, text: str, seq_len: int) -> tuple[float, float]:
    """(bits per byte of `text`, bytes per token) under the trained model."""
    import torch

    from peer.compute.model import lm_loss
    from peer.compute.stage_checkpoint import load_stage_modules
    from tokendata.tokenizer import load_tokenizer
    _, stages, _ = load_stage_modules(checkpoint)
    ids = load_tokenizer(tokenizer).encode(text)
    nats, predicted = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(ids) - 1, seq_len):   # every token after the first predicted once
            window = torch.tensor(ids[start:start + seq_len + 1]).unsqueeze(0)
            if window.shape[1] < 2:
                break
            hidden = stages[0].embed_tokens(window[:, :-1])
            for stage in stages:
                hidden = stage(hidden)
            loss = lm_loss(stages[0].logits(hidden), window[:, 1:])
            nats += float(loss) * (window.shape[1] - 1)
            predicted += window.shape[1] - 1
    n_bytes = len(text.encode("utf-8"))
    return nats / math.log(2) / n_bytes * (len(ids) / predicted if predicted else 1.0), n_bytes / len(ids)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--skip", default="0")
    p.add_argument("--model", default="tiny")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--timeout", type=float, default=900)
    args = p.parse_args(argv)
    from peer.data import load_corpus
    corpus = load_corpus()
    held_out = corpus[len(corpus) - int(len(corpus) * HELD_OUT_FRACTION):].decode("utf-8", errors="ignore")
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f}", flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-tokenizer-") as tmp:
        for tokenizer in ("byte", "bpe"):
            run = train(tokenizer, args, Path(tmp))
            bpb, bytes_per_token = held_out_bits_per_byte(tokenizer, Path(tmp) / f"ckpt-{tokenizer}", held_out,
                                                          args.seq_len)
            results[tokenizer] = (bpb, run["tokens_per_s"], bytes_per_token)
            print(f"{tokenizer:>4}: held-out {bpb:.3f} bits/byte, {run['tokens_per_s']:.0f} tokens/s "
                  f"({run['tokens_per_s'] * bytes_per_token:.0f} bytes of text/s), {bytes_per_token:.2f} bytes/token, "
                  f"loss {run['first_loss']:.3f} -> {run['last_loss']:.3f}, {run['wall_s']:.0f}s", flush=True)
    print(f"RESULT bpb_byte={results['byte'][0]:.4f} bpb_bpe={results['bpe'][0]:.4f} "
          f"tokens_per_s_byte={results['byte'][1]:.0f} tokens_per_s_bpe={results['bpe'][1]:.0f} "
          f"bytes_per_token_bpe={results['bpe'][2]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
