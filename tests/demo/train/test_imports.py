"""The trainers (the demo model's and its draft's) are plain PyTorch: nothing they import,
directly or not, is engine or kernel code."""

import pytest
from test_import_graph import import_graph

FORBIDDEN = ("atomk31.engine", "atomk31.model", "atomk31.ops", "atomk31.triton_kernels",
             "gluon_kernels", "flydsl_kernels")


@pytest.mark.parametrize("trainer", ["atomk31.demo.train", "atomk31.demo.train_draft"])
def test_the_trainer_reaches_no_engine_or_kernel_module(trainer):
    graph = import_graph()
    seen, todo = set(), [m for m in graph if m == trainer or m.startswith(trainer + ".")]
    assert todo, f"no module {trainer} in the import graph"
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.get(module, ())
    reached = sorted(m for m in seen if m.startswith(FORBIDDEN))
    assert not reached, f"the trainer reaches {reached}"
    assert "server.chat_template" in seen and "atomk31.checkpoint" in seen
