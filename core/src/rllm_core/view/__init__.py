"""``rllm-core view``: a read-only local web page over run folders and their trace stores.

:mod:`~rllm_core.view.data` answers what the page shows through the readers of
:mod:`rllm_core.inspection` (the same as ``runs show`` and ``traces show``),
:mod:`~rllm_core.view.app` serves it as JSON with the page's static files (plain HTML,
JavaScript and CSS in ``static/``, no build step, nothing fetched from the network).
"""

from rllm_core.view.app import ViewApp
from rllm_core.view.data import RunsView

__all__ = ["RunsView", "ViewApp"]
