"""Modal sandboxes for rllm-core.

The entry module is :mod:`rllm_sandbox_backend_modal.plugin`; it does not import the modal SDK. The
backend (:mod:`rllm_sandbox_backend_modal.backend`) loads it when a plan builds the component.
"""
