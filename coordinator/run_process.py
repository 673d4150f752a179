"""`skippipe-coordinator run` as a process: the app until a stop (Ctrl-C, SIGTERM), a bad
setting or key as one line and an exit code, each iteration's summary printed."""
import asyncio
import logging

from opsweb.stopping import run_until_stopped

from protocol.errors import FieldError
from protocol.membership import JoinKeyError

from coordinator.app import CoordinatorApp, spec_from_config
from coordinator.config import CoordinatorConfig
from coordinator.data_setup import RunData
from coordinator.iteration_summaries import IterationSummary
from coordinator.organiser_key import OrganiserKeyError

logger = logging.getLogger("skippipe.coordinator")


def run_coordinator(config: CoordinatorConfig, run_data: RunData | None = None) -> int:
    async def main(stop: asyncio.Event) -> int:
        return await CoordinatorApp(config, on_iteration=print_summary, run_data=run_data, stop=stop).run()
    try:
        spec_from_config(config, run_data)   # a bad setting is a one-line error before anything starts
        return run_until_stopped(main, "the coordinator")
    except (JoinKeyError, OrganiserKeyError) as exc:
        logger.error("%s", exc)
        return 1
    except FieldError as exc:
        flag = SPEC_FLAGS.get(exc.field)
        logger.error("invalid run setting%s: %s", f" ({flag})" if flag else "", exc)
        return 2


# the run spec's fields that a coordinator flag sets, for error messages
SPEC_FLAGS = {"learning_rate": "--lr", "warmup_steps": "--warmup", "max_steps": "--steps", "skip_ratio": "--skip",
              "num_stages": "--stages", "microbatch_samples": "--microbatch-samples", "seq_len": "--seq-len",
              "microbatches_per_origin": "--microbatches", "global_batch": "--global-batch", "run": "--run",
              "gradient_exchange": "--gradient-exchange"}


def print_summary(s: IterationSummary) -> None:
    print(f"iteration {s.iteration}: loss {s.loss:.4f}, {s.tokens / max(s.duration_s, 1e-9):.0f} tokens/s, "
          f"{s.duration_s:.2f}s, microbatches completed={s.completed} rerouted={s.rerouted} "
          f"skipped_stage={s.skipped_stage} reissued={s.reissued} lost={s.lost}", flush=True)
