"""atomk31: an inference engine for Kimi K3.1 Pro.

`from atomk31 import LLM, SamplingParams` is the offline API; `atomk31 serve` the server.
"""

__version__ = "0.1.0"
__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    # Lazy, so that `import atomk31.config` (the CLI, tests of formats) does not build torch ops.
    if name in __all__:
        from atomk31 import engine
        return getattr(engine, name)
    raise AttributeError(f"module 'atomk31' has no attribute {name!r}")
