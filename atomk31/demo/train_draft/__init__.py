"""The trainer of the built-in model's DSpark draft (`python -m atomk31.demo.train_draft`).

Plain PyTorch, like `atomk31.demo.train` (whose model, checkpoint reader and data pipeline it
reuses): it imports neither the engine (`atomk31.engine`, `atomk31.model`, `atomk31.ops`) nor
any kernel package. It distills the shipped target into a draft of MODEL_SPEC §5 and writes it
with the DSpark checkpoint writer, so the engine loads it as any draft release.
"""
