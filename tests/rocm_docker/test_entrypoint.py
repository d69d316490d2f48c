"""The ROCm container's entrypoint (rocm_docker/entrypoint.py): the command it builds, and that
`atomk31 serve` accepts the flags of the entrypoint and of the MI355X guide. Nothing starts."""

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

from server.launch import add_serve_arguments

ROOT = Path(__file__).resolve().parents[2]


def load_entrypoint():
    path = ROOT / "rocm_docker" / "entrypoint.py"
    spec = importlib.util.spec_from_file_location("entrypoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="atomk31 serve")
    add_serve_arguments(parser)
    return parser


def test_entrypoint_serves_with_block_size_128_and_the_users_flags():
    command = load_entrypoint().build_command(["--model", "/models/k31", "--port", "9000"])
    assert command == ["atomk31", "serve", "--block-size", "128", "--model", "/models/k31",
                       "--port", "9000"]
    args = serve_parser().parse_args(command[2:])
    assert (args.block_size, args.model, args.port) == (128, "/models/k31", 9000)


def test_users_block_size_wins():
    command = load_entrypoint().build_command(["serve", "--block-size", "64"])
    assert serve_parser().parse_args(command[2:]).block_size == 64


def test_other_subcommands_pass_through():
    assert load_entrypoint().build_command(["info"]) == ["atomk31", "info"]


def test_dockerfile_default_arguments_parse():
    dockerfile = (ROOT / "rocm_docker" / "Dockerfile").read_text()
    cmd = re.search(r'^CMD \[(.*)\]$', dockerfile, re.M).group(1)
    flags = [part.strip().strip('"') for part in cmd.split(",")]
    command = load_entrypoint().build_command(flags)
    args = serve_parser().parse_args(command[2:])
    assert (args.host, args.port, args.block_size) == ("0.0.0.0", 8000, 128)


def test_mi355x_guide_flags_parse():
    guide = (ROOT / "rocm_docker" / "README.md").read_text()
    block = guide.split("## MI355X")[1].split("```bash")[1].split("```")[0]
    flags = " ".join(line.rstrip("\\").strip() for line in block.splitlines())
    after_image = flags.split("atomk31-rocm", 1)[1].split()
    args = serve_parser().parse_args(load_entrypoint().build_command(after_image)[2:])
    assert args.kernel_backend == "amd" and args.block_size == 128


def test_bad_flag_is_refused():
    with pytest.raises(SystemExit):
        serve_parser().parse_args(load_entrypoint().build_command(["--block-size", "x"])[2:])
