"""The queue's Lua scripts, read once per process from the package's `lua/` folder.

`load(name)` is the text of `lua/<name>.lua`; clients register it (redis-py `register_script`,
or `redis.run_script`), which sends it by digest and loads it where Redis lacks it.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def load(name: str) -> str:
    """The text of the script `lua/<name>.lua`, shipped with the package."""
    return resources.files("vllm_srun.queue").joinpath("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")
