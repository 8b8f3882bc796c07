"""Shell completion (through a real bash), the man page, and the examples in
every command's --help: all generated from the real parser."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from spark_watchdog.cli.completion import bash_script, zsh_script
from spark_watchdog.cli.examples import EXAMPLES
from spark_watchdog.cli.main import build_parser, main, program
from spark_watchdog.cli.manpage import man_page
from spark_watchdog.cli.parser_tree import Command, Option


def _complete(script: Path, words: list[str], cwd: Path) -> list[str]:
    """COMPREPLY of the generated function for the words (the last is being typed)."""
    bash = shutil.which("bash")
    assert bash is not None
    array = " ".join(shlex.quote(w) for w in words)
    code = (
        f"source {shlex.quote(str(script))}\n"
        f"COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}\n"
        "_spark_watchdog\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    result = subprocess.run(
        [bash, "--norc", "-c", code], capture_output=True, text=True, cwd=cwd, timeout=30
    )
    assert result.returncode == 0 and not result.stderr, result.stderr
    return [line for line in result.stdout.splitlines() if line]


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "spark-watchdog.bash"
    path.write_text(bash_script(program()))
    return path


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["spark-watchdog", "la"], ["lab"]),
        (["spark-watchdog", "lab", ""], ["agent-demo", "demo", "inject", "run", "up"]),
        (["spark-watchdog", "history", "--s"], ["--since"]),
        (
            ["spark-watchdog", "power", "--config", "x.yaml", "spark-1", ""],
            ["cycle", "off", "on", "status"],
        ),
        (["spark-watchdog", "completion", ""], ["bash", "zsh"]),
        (["spark-watchdog", "probe", "gpu", "--d"], ["--deadline"]),
    ],
)
def test_bash_completes_commands_options_and_values(
    script: Path, tmp_path: Path, words: list[str], expected: list[str]
) -> None:
    assert sorted(_complete(script, words, tmp_path)) == expected


def test_bash_completes_files_after_a_file_option(script: Path, tmp_path: Path) -> None:
    (tmp_path / "controller.yaml").write_text("")
    (tmp_path / "agent.yaml").write_text("")
    got = _complete(script, ["spark-watchdog", "controller", "--config", "co"], tmp_path)
    assert got == ["controller.yaml"]
    # A value that is not a file (a URL) offers nothing rather than commands.
    assert _complete(script, ["spark-watchdog", "probe", "vllm", "--url", ""], tmp_path) == []


def test_every_command_is_completed(script: Path, tmp_path: Path) -> None:
    for command in program().walk():
        if not command.path:
            continue
        *parents, last = command.path
        offered = _complete(script, ["spark-watchdog", *parents, last[:2]], tmp_path)
        assert last in offered, (command.path, offered)


def test_zsh_script_loads_the_bash_function_through_bashcompinit() -> None:
    text = zsh_script(program())
    assert text.startswith("#compdef spark-watchdog\n")
    assert "bashcompinit" in text and "complete -F _spark_watchdog spark-watchdog" in text


def test_completion_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "bash"]) == 0
    assert "complete -F _spark_watchdog spark-watchdog" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["completion", "fish"])
    assert exc.value.code == 2
    assert "invalid choice: 'fish'" in capsys.readouterr().err


def test_man_page_has_a_section_per_command_and_escapes_roff() -> None:
    root = program()
    page = man_page(root)
    assert page.startswith(".TH SPARK-WATCHDOG 1 ")
    for command in root.walk():
        if command.path:
            assert f".SS spark-watchdog {' '.join(command.path)}\n" in page
    # Text that would be a roff request, or a backslash, stays text.
    odd = Command(
        path=(),
        help="",
        description="",
        usage="",
        epilog="",
        subcommands=[
            Command(
                ("x",),
                "h",
                ".B not a macro\n'also not",
                "u",
                "e",
                [Option(("--a\\b",), "h", None)],
            )
        ],
    )
    text = man_page(odd)
    assert "\\&.B not a macro" in text and "\\&'also not" in text
    assert "--a\\eb" in text


@pytest.mark.skipif(shutil.which("groff") is None, reason="groff not installed")
def test_man_page_renders_without_warnings(tmp_path: Path) -> None:
    page = tmp_path / "spark-watchdog.1"
    page.write_text(man_page(program()))
    result = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", str(page)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
    assert "spark-watchdog lab inject" in result.stdout


def test_every_leaf_command_shows_examples() -> None:
    missing = [
        " ".join(c.path)
        for c in program().walk()
        if c.path and not c.subcommands and "example" not in c.epilog.lower()
    ]
    assert missing == []


@pytest.mark.parametrize("line", [line for lines in EXAMPLES.values() for line in lines])
def test_examples_parse(line: str) -> None:
    argv = shlex.split(line.split("|")[0].split(">")[0])
    assert argv[0] == "spark-watchdog"
    if "--directory" in argv and not Path(argv[argv.index("--directory") + 1]).is_dir():
        pytest.skip("the example's directory is not on this machine (no persistent journal)")
    build_parser().parse_args(argv[1:])  # a usage error exits 2 and fails the test


def test_examples_are_keyed_by_real_commands() -> None:
    paths = {c.path for c in program().walk()}
    assert set(EXAMPLES) <= paths
    assert all(re.match(r"^spark-watchdog ", line) for lines in EXAMPLES.values() for line in lines)
