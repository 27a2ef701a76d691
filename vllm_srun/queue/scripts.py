"""The queue's Lua scripts, read once per process from the package's `lua/` folder.

`load(name)` is the text of `lua/<name>.lua` without its leading comment (a script sent whole,
as on a cluster pipeline, carries no prose); clients register it (redis-py `register_script`,
or `redis.run_script`), which sends it by digest and loads it where Redis lacks it.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def load(name: str) -> str:
    """The script `lua/<name>.lua`, shipped with the package, less its leading `--` lines."""
    text = resources.files("vllm_srun.queue").joinpath("lua").joinpath(f"{name}.lua").read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "".join(lines)
