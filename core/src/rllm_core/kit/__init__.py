"""Code several plugins share, so that no plugin imports another.

- Renderers: :mod:`.toolformats` (each model family's tool-call and reasoning syntax, read,
  written and streamed, by name; :mod:`.toolcalls` keeps the Hermes block reader and writer
  under their old names) and :mod:`.completions` (reading sampled tokens back: the stop
  token, the think block, the parsed response and the assistant message it stands for).
- Harnesses: :mod:`.chat` (one chat call to an episode's endpoint with its failures typed;
  needs ``openai``, which ``rllm-core[chat]`` installs), :mod:`.templates` (prompt and
  command templates checked against the placeholders a key allows) and :mod:`.harness_keys`
  (the config keys of a chat request and of an episode's time cap).
- Anything that calls a remote service: :mod:`.retry` (the retry keys, bounded retries with
  jittered exponential backoff, and pacing).
- Managed trainer backends: :mod:`.managed` (service calls retried and counted, the transient
  status test, their settings, the config keys and component spec every such backend shares,
  supervised steps and scoring on the service's ``cross_entropy`` loss),
  :mod:`.trainer_config` (the AdamW keys every trainer backend takes) and
  :mod:`.token_hygiene` (datums a service would reject, dropped before the step). The
  services' fused loss kernels, and the choice between them and the custom-loss path, are the
  core's (:mod:`rllm_core.algorithms.native_losses`): a backend's port returns the route.
- Sandbox backends: :mod:`.sandboxes` (closing on ``async with`` exit, the SDK-error map, the
  retry wrapper that says how many attempts were made) and :mod:`.remote_exec` (the shell
  protocol that runs one command in a remote sandbox).
- Question/answer task sources (``jsonl``, ``datasets``): :mod:`.qa_tasks` (their keys, the
  rows checked into tasks, splits and grading) and :mod:`.answers` (the ``exact``, ``numeric``
  and ``boxed`` rewards).

The core's own modules never import this package (``tests/test_core_floors.py`` holds them
to it); plugins do.
"""
