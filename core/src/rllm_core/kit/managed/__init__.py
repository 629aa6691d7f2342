"""What the managed trainer backends (Tinker, Fireworks) share: requests to a remote training
service, retried and counted (:mod:`.calls`); the config keys and component traits of such a
backend (:mod:`.config`); supervised steps and logprob scoring on the service's own
``cross_entropy`` loss (:mod:`.supervised`).

None of these modules imports torch or a service's SDK: a backend passes its SDK's datum
constructor and training client in.
"""

from rllm_core.kit.managed.calls import (
    ManagedServiceSettings,
    ServiceCalls,
    lost_answer,
    retry_after_s,
    retryable_status,
    service_metrics,
)

__all__ = [
    "ManagedServiceSettings",
    "ServiceCalls",
    "lost_answer",
    "retry_after_s",
    "retryable_status",
    "service_metrics",
]
