"""Code several plugins share, so that no plugin imports another.

:mod:`.toolcalls` (the ``<tool_call>`` text format of ChatML-family templates), :mod:`.chat`
(one chat call to an episode's endpoint with its failures typed; needs ``openai``, which
``rllm-core[chat]`` installs), :mod:`.retry` (bounded retries with jittered exponential
backoff, and pacing), :mod:`.dockerfile` (reading a Dockerfile so that a sandbox booting its
base image can replay it) and :mod:`.sizes` (size strings such as ``"4G"`` in MiB). The
core's own modules never import this package; plugins do.
"""
