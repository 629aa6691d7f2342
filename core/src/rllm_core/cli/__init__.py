"""The ``rllm-core`` command line.

Exit codes: 0 success; 1 the run (or a check such as ``plugins --check``) failed; 2 usage or
plan error (bad arguments, invalid plan, unknown component).
"""

from __future__ import annotations

import logging

import click

from rllm_core import __version__
from rllm_core.cli.checkpoints_cmd import checkpoints
from rllm_core.cli.dataset_cmd import dataset
from rllm_core.cli.docs_cmd import docs
from rllm_core.cli.eval_cmd import eval_
from rllm_core.cli.gateway_cmd import gateway
from rllm_core.cli.models_cmd import models
from rllm_core.cli.plan_cmd import plan
from rllm_core.cli.plugins_cmd import plugins
from rllm_core.cli.run_cmd import run
from rllm_core.cli.runs_cmd import runs
from rllm_core.cli.sft_cmd import sft
from rllm_core.cli.tasks_cmd import tasks
from rllm_core.cli.traces_cmd import traces
from rllm_core.cli.view_cmd import view

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rllm-core")
def main() -> None:
    """RL post-training for LLM agents, described by one plan.toml."""
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")


main.add_command(plugins)
main.add_command(plan)
main.add_command(run)
main.add_command(sft)
main.add_command(dataset)
main.add_command(eval_)
main.add_command(docs)
main.add_command(gateway)
main.add_command(models)
main.add_command(tasks)
main.add_command(runs)
main.add_command(checkpoints)
main.add_command(traces)
main.add_command(view)


if __name__ == "__main__":
    main()
