"""The `vllm-srun` command: one module per subcommand group; `main` is the entry point."""
