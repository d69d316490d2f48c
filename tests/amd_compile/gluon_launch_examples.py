"""The Gluon kernel modules whose ``compile_examples(target)`` the compile checks compile
(capture_gluon_isa.py in its subprocesses, test_gluon_compile.py for the test list), each
example once per size case (gluon_kernels/compile.py's ``size_cases``)."""

from gluon_kernels import indexer_score, indexer_score_hopper_launch, radix_topk
from gluon_kernels.hopper import ptpc_fp8

# the last two: Hopper only
KERNEL_MODULES = (indexer_score, radix_topk, ptpc_fp8, indexer_score_hopper_launch)
