"""The default model: the shipped demo checkpoint once atomk31/demo/weights/ holds one, the random
tiny checkpoint until then (`atomk31 serve`, `atomk31 generate` and `LLM()` without a model)."""

import shutil

import atomk31.cli
import atomk31.demo.shipped as shipped
from server import launch


def test_without_weights_the_default_is_the_tiny_checkpoint(monkeypatch, tmp_path):
    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path / "weights")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert shipped.shipped_checkpoint() is None
    path = atomk31.cli.ensure_default_model()
    assert path == tmp_path / "cache" / "atomk31" / "tiny-seed0"
    assert (path / "model.safetensors").is_file()


def test_with_weights_the_default_is_the_shipped_checkpoint(monkeypatch, tmp_path, tiny_checkpoint):
    weights = tmp_path / "weights"
    shutil.copytree(tiny_checkpoint, weights)
    monkeypatch.setattr(shipped, "SHIPPED_DIR", weights)
    assert shipped.shipped_checkpoint() == weights
    assert atomk31.cli.ensure_default_model() == weights
    (weights / "model.safetensors").unlink()                 # a half-copied directory is not used
    assert shipped.shipped_checkpoint() is None


def test_serve_names_the_shipped_model_atomk31_demo(monkeypatch, tiny_checkpoint):
    import uvicorn

    started = {}

    class FakeServer:
        should_exit = True       # the engine watchdog stops at once
        def __init__(self, config):
            started["app"] = config.app
            self.started = True

        def run(self) -> None:
            pass

    monkeypatch.setattr(shipped, "shipped_checkpoint", lambda: tiny_checkpoint)
    monkeypatch.setattr(atomk31.cli, "ensure_default_model", lambda: tiny_checkpoint)
    monkeypatch.setattr(uvicorn, "Server", FakeServer)
    parser = __import__("argparse").ArgumentParser()
    launch.add_serve_arguments(parser)
    assert launch.serve(parser.parse_args([]), atomk31.cli.ensure_default_model) == 0
    assert started["app"].state.served_model_name == launch.DEMO_MODEL_NAME == "atomk31-demo"


def test_llm_without_a_model_uses_the_shipped_checkpoint(monkeypatch, tiny_checkpoint):
    from atomk31 import LLM

    monkeypatch.setattr(shipped, "shipped_checkpoint", lambda: tiny_checkpoint)
    llm = LLM(block_size=16, kernel_backend="torch")
    assert llm.engine.model_config.vocab_size == 1024


def test_llm_without_weights_falls_back_to_the_random_tiny_checkpoint(monkeypatch, tmp_path):
    from atomk31 import LLM

    monkeypatch.setattr(shipped, "SHIPPED_DIR", tmp_path / "weights")
    llm = LLM(block_size=16, kernel_backend="torch")
    assert llm.engine.model_config.num_hidden_layers == 8          # the tiny preset
