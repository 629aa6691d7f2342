# The two commands for a fresh machine are `make quickstart` and `make test`; both set up
# .venv first (scripts/setup.sh skips the work when nothing changed).

.DEFAULT_GOAL := help
.PHONY: help setup quickstart agent-quickstart test docs

# Extra pytest arguments: make test PYTEST_ARGS="-k plan -x"
PYTEST_ARGS ?=

help:
	@echo "make quickstart         set up .venv, check and run examples/quickstart/plan.toml (a few minutes)"
	@echo "make agent-quickstart  SFT warm start, then RL of a shell agent; held-out pass@1 before and after"
	@echo "make test               set up .venv, then ruff, the core-alone check and the whole test suite"
	@echo "make setup              only set up .venv (RLLM_FORCE_SETUP=1 reinstalls everything)"
	@echo "make docs               set up .venv, then serve the documentation site on http://127.0.0.1:8000"

setup:
	@bash scripts/setup.sh

quickstart: setup
	@bash scripts/quickstart.sh

agent-quickstart: setup
	@bash scripts/agent_quickstart.sh

test: setup
	@bash scripts/test.sh $(PYTEST_ARGS)

docs: setup
	@.venv/bin/python -m mkdocs serve
