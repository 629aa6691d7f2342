"""Local sandboxes for rllm-core.

The sandbox backend ``local`` (:class:`rllm_sandbox_backend_local.backend.LocalBackend`) gives each
sandbox its own bubblewrap mount, PID, IPC, UTS and network namespaces over a private root
directory, or runs plain subprocesses in a directory when bubblewrap is unusable. The entry
module is :mod:`rllm_sandbox_backend_local.plugin`; it imports only rllm-core, pydantic and the
standard library.
"""
