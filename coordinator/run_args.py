"""What the coordinator makes of the run flags (swarmcore/cli/run_flags.py), for both programs
that take them, `skippipe-coordinator run` and `skippipe-swarm`: the run's data and model,
checked before any network starts, and the CoordinatorConfig fields they set."""
import argparse
import sys

from modelconfig import ConfigError, check_stages, resolve_model, to_spec_json
from swarmcore.cli.support import EXIT_USAGE, fail_usage


def resolve_data_or_exit(prog: str, args: argparse.Namespace):
    """The run's data, checked before any network starts: one line and exit code 2 if unusable."""
    from coordinator.data_setup import DataSetupError, resolve_run_data
    try:
        return resolve_run_data(args.data, args.tokenizer)
    except DataSetupError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def resolve_arch(prog: str, args: argparse.Namespace, vocab_size: int) -> int | None:
    """Sets args.arch from --model (its vocabulary follows the run's tokenizer) and checks it
    splits into --stages; the usage error's exit code if not, else None."""
    try:
        args.arch = resolve_model(args.model, vocab_size)
        check_stages(args.arch, args.stages)
    except ConfigError as exc:
        return fail_usage(prog, f"--model: {exc}" if exc.field != "--model" else str(exc))
    return None


def print_path_length(args: argparse.Namespace) -> None:
    from coordinator.planner.rules import describe_path
    k = 0.0 if args.strategy == "full" else args.skip   # `full` visits every stage whatever --skip says
    print(f"{args.strategy}, skip ratio {k:.4g}: {describe_path(args.stages, k)}", flush=True)


def run_config_fields(args: argparse.Namespace) -> dict:
    """The CoordinatorConfig fields the run flags set (args.arch resolved)."""
    return dict(run=args.run, model=args.arch.name, model_config=to_spec_json(args.arch), num_stages=args.stages,
                skip_ratio=args.skip, strategy=args.strategy, seed=args.seed, max_steps=args.steps,
                microbatch_samples=args.microbatch_samples, seq_len=args.seq_len,
                microbatches_per_origin=args.microbatches, global_batch=args.global_batch,
                gradient_exchange=args.gradient_exchange, learning_rate=args.lr, status_port=args.status_port,
                join_key_path=args.join_key, data_dir=args.data, tokenizer=args.tokenizer,
                checkpoint_dir=args.checkpoint_dir, wire_compression=args.wire_compression)


def hivemind_logs_as(log_format: str) -> None:
    if log_format == "json":  # hivemind's own colored handler would bypass the JSON one
        from hivemind.utils.logging import use_hivemind_log_handler
        use_hivemind_log_handler("nowhere")
