"""The trainer on its own island, training for real: the scheduler launches each incarnation
as a process through the local-process launcher; the first is stopped at a ``scheduled`` cut
while no batch waits, the second restores it from its command file's cut once batches arrive,
and the run ends bitwise equal to an in-process trainer that trained every batch in one
incarnation (``test_trainer_role``'s run, helpers and check)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_trainer_role, its helpers

from rllm_core.run.cuts import latest_cut
from rllm_core.training.island import (
    CommandFile,
    IslandTrainer,
    LocalProcessLauncher,
    island_key,
    read_command,
)
from rllm_core.training.scheduler import Controller, SchedulerSettings
from rllm_core.training.shared import SharedRun
from rllm_object_store_file.objects import FileObjectStore
from test_trainer_role import (
    AGE,
    BATCH,
    GROUP,
    LORA,
    NAME,
    STEPS,
    Batches,
    cuts,
    journal,
    produce_once_stopped,
    shared_buffer,
    trainer_role,
)

JOB = Path(__file__).with_name("island_training_job.py")


def island_scheduler(root: Path, model: Path) -> tuple[Controller, IslandTrainer]:
    store = FileObjectStore(root / "store")
    shared = SharedRun(store, NAME)
    launcher = LocalProcessLauncher(
        store,
        logs=root / "logs",
        argv=lambda command, key: [
            sys.executable,
            str(JOB),
            str(root),
            str(model),
            json.dumps(LORA),
            str(command.incarnation),
        ],
    )
    trainer = IslandTrainer(
        launcher=launcher,
        shared=shared,
        command=CommandFile(incarnation=0, run=NAME, plan_path="plan.toml", plan="", cwd=str(root)),
        steps=STEPS,
        ready_timeout_s=120.0,
        poll_s=0.02,
    )

    def backlog() -> int:
        if controller.state.running:
            step = trainer._seen
        else:
            ref = latest_cut(store, shared.prefix)
            step = ref.step if ref is not None else 0
        return shared.waiting_groups(step, BATCH)

    controller = Controller(
        lifecycle=trainer,
        settings=SchedulerSettings(
            batch_groups=BATCH, max_policy_age=AGE, idle_stop_s=0.5, poll_s=0.02
        ),
        store=store,
        prefix=shared.key("scheduler"),
        backlog=backlog,
        data_ended=lambda: shared.ticket(STEPS) is not None,
    )
    trainer.record = controller.record_event
    return controller, trainer


@pytest.mark.slow
def test_two_launched_incarnations_end_bitwise_equal_to_one_in_process(tiny_model_dir, tmp_path):
    # Run A: one in-process incarnation trains every batch.
    straight_store = FileObjectStore(tmp_path / "a" / "store")
    batches = Batches(straight_store)
    for step in range(1, STEPS + 1):
        batches.produce(step)
    straight, _ = trainer_role(tmp_path / "a", tiny_model_dir, LORA)
    try:
        result = asyncio.run(asyncio.wait_for(straight.run(), 60))
    finally:
        straight.c.trainer.close()
    assert (result.status, result.step) == ("finished", STEPS)

    # Run B: batches 3 and 4 arrive only after S1 stopped the idle first job.
    root = tmp_path / "b"
    store = FileObjectStore(root / "store")
    batches = Batches(store)
    for step in (1, 2):
        batches.produce(step)
    controller, _ = island_scheduler(root, tiny_model_dir)

    async def run_b() -> Any:
        outcome, _ = await asyncio.gather(
            controller.run(), produce_once_stopped(store, batches, range(3, STEPS + 1))
        )
        return outcome

    outcome = asyncio.run(asyncio.wait_for(run_b(), 240))
    logs = "".join(p.read_text()[-2000:] for p in sorted((root / "logs").glob("*.log")))
    assert (outcome.ended, outcome.incarnation, outcome.rounds) == ("finished", 2, STEPS), logs
    assert [
        (r["kind"], r["incarnation"], r.get("trigger") or r.get("reason"))
        for r in journal(store)
        if r["kind"] in ("started", "launched", "ready", "released", "stopped", "failed")
    ] == [
        ("started", 1, None),
        ("launched", 1, None),
        ("ready", 1, None),
        ("released", 1, "stopped"),
        ("stopped", 1, "scheduled"),
        ("started", 2, None),
        ("launched", 2, None),
        ("ready", 2, None),
        ("released", 2, "stopped"),
        ("stopped", 2, "final"),
    ], logs

    # Incarnation 2 was told to resume from incarnation 1's scheduled cut, and did.
    shared = SharedRun(store, NAME)
    second = read_command(store, island_key(shared, 2, "command.json"))
    assert second.resume_cut == "0000000002-000001"
    assert (
        "restored cut 0000000002-000001 (step 2)" in (root / "logs" / "trainer-2.log").read_text()
    )
    written = cuts(store)
    assert written["0000000002-000001"].trigger == "scheduled"
    final = latest_cut(store, f"runs/{NAME}")
    assert final is not None
    assert (final.name, final.trigger, final.weight_version) == ("0000000004-000002", "final", 4)
    batch_samples = BATCH * GROUP
    assert shared_buffer(store).committed() == STEPS * batch_samples - 1

    # The trainer state and the loop state byte for byte, but for the order of the adapter
    # config's target modules: peft writes a set, in an order that varies between processes.
    straight_final = cuts(straight_store)["0000000004-000001"]
    config = "trainer/adapter/adapter_config.json"
    assert {k: f.sha256 for k, f in straight_final.files.items() if k != config} == {
        k: f.sha256 for k, f in written[final.name].files.items() if k != config
    }

    def adapter_config(where: FileObjectStore, cut: str) -> dict[str, Any]:
        value = json.loads(where.get(f"runs/{NAME}/cuts/{cut}/{config}"))
        return value | {"target_modules": sorted(value["target_modules"])}

    assert adapter_config(straight_store, "0000000004-000001") == adapter_config(store, final.name)
