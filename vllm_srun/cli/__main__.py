"""`python -m vllm_srun.cli`: the `vllm-srun` command."""

import sys

from vllm_srun.cli.main import main

sys.exit(main())
