"""The README's commands are the ones CI and users run."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _commands_in_readme() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = text.split("```bash\n")[1:]
    return [b.split("```")[0].strip() for b in blocks]


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = [line for line in (ROOT / ".ci/run").read_text().splitlines()
                if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert len(ci_lines) == 1, f".ci/run must run one command, found {ci_lines}"
    assert ci_lines[0] in _commands_in_readme(), ".ci/run's command is not the README's"


def test_readme_has_run_and_test_commands_first():
    commands = _commands_in_readme()
    assert "atomk31" in commands[0] and "pytest" in commands[1]
