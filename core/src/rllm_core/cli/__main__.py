from rllm_core.cli import main

main()
