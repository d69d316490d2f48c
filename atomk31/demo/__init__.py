"""The built-in trained model: its task generators, trainer, evaluator and shipped weights.

* `tasks/`: the four task families (arithmetic, passkey, tools, chat), endless seeded generators;
* `train/`: the trainer, plain PyTorch (`python -m atomk31.demo.train --seed 0 --out DIR`);
* `evaluate.py`: `atomk31 eval`, the task families scored through any server's OpenAI API;
* `weights/`: the shipped checkpoint, the default of `atomk31 serve` and `LLM()` once present.
"""
