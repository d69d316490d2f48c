"""The trainer of the built-in model (`python -m atomk31.demo.train --seed 0 --out DIR`).

Plain PyTorch: a differentiable K3.1 (KDA, gated MLA with the DSA indexer, latent MoE with MXFP4
routed experts, AttnRes) whose parameters carry the checkpoint's names, trained on the task
families and written in the release's checkpoint format. It imports neither the engine
(`atomk31.engine`, `atomk31.model`, `atomk31.ops`) nor any kernel package.
"""
