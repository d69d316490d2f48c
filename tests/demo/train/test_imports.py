"""The trainer is plain PyTorch: nothing it imports, directly or not, is engine or kernel code."""

from test_import_graph import import_graph

FORBIDDEN = ("atomk31.engine", "atomk31.model", "atomk31.ops", "atomk31.triton_kernels",
             "gluon_kernels", "flydsl_kernels")


def test_the_trainer_reaches_no_engine_or_kernel_module():
    graph = import_graph()
    seen, todo = set(), [m for m in graph if m.startswith("atomk31.demo.train")]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += graph.get(module, ())
    reached = sorted(m for m in seen if m.startswith(FORBIDDEN))
    assert not reached, f"the trainer reaches {reached}"
    assert "server.chat_template" in seen and "atomk31.checkpoint" in seen
