"""Daytona sandboxes for rllm-core.

The entry module (:mod:`rllm_sandbox_backend_daytona.plugin`) imports nothing heavy; the backend in
:mod:`rllm_sandbox_backend_daytona.backend` imports the daytona SDK when a plan builds it.
"""
