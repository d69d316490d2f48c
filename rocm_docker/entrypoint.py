"""Entrypoint of the ROCm container: `atomk31 serve --block-size 128` plus the user's flags.

`docker run IMAGE --model /models/k31 --port 8000` becomes
`atomk31 serve --block-size 128 --model /models/k31 --port 8000`; a user's own
`--block-size` wins (argparse keeps the last value). A first argument that is another atomk31
subcommand (`info`, `generate`, ...) runs that instead, and `--help` shows serve's flags.
"""

import os
import sys

DEFAULT_SERVE_FLAGS = ("--block-size", "128")
SUBCOMMANDS = ("serve", "generate", "info", "make-checkpoint", "bench")


def build_command(argv: list[str]) -> list[str]:
    """The atomk31 command line for the container's arguments ``argv`` (argv[1:])."""
    if argv and argv[0] in SUBCOMMANDS:
        if argv[0] == "serve":
            return ["atomk31", "serve", *DEFAULT_SERVE_FLAGS, *argv[1:]]
        return ["atomk31", *argv]
    return ["atomk31", "serve", *DEFAULT_SERVE_FLAGS, *argv]


def main() -> None:
    command = build_command(sys.argv[1:])
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
