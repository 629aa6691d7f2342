"""The conformance kit for plugin authors.

Installed as a pytest plugin (``pytest11`` entry point), so its fixtures are available in any
test session where rllm-core is installed. Abstract suites live in
:mod:`rllm_core.testing.suites`: a plugin's test class subclasses the suite for its kind and
provides the fixtures the suite documents.
"""
