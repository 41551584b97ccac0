"""Every bad ``VERONICA_*`` value, and every hostile policy file, is an error naming it.

``install_zero_code`` runs here with its enforcement hooks marked as already
installed, so only the configuration part runs in this process; the whole
path, hooks included, runs in the zero-code subprocess tests.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._clock import FakeClock
from veronica_otel import ExecutionConfig, _propagation
from veronica_otel.instrumentors._outbound import Propagation
from veronica_otel.policy_file import PolicyFile, PolicyFileError
from veronica_otel.startup import distro

DEEP = 100_000
LONGEST_MESSAGE = 600  # a megabyte of bad value is not echoed back


@pytest.fixture
def zero_code(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(distro, "_installed", True)  # the hooks: not in this process
    yield
    _propagation.set_default_context(None)


def refused_with(environ: dict[str, str]) -> Exception:
    """Install from ``environ``; return the error every contained call now raises."""
    assert distro.install_zero_code(environ) is None
    with pytest.raises(Exception) as info:
        _propagation.default_context()
    return info.value


BAD_VALUES = [
    ("VERONICA_MAX_COST_USD", "abc"),
    ("VERONICA_MAX_COST_USD", "nan"),
    ("VERONICA_MAX_COST_USD", "1e400"),
    ("VERONICA_MAX_COST_USD", "-1"),
    ("VERONICA_MAX_STEPS", "9" * 5000),
    ("VERONICA_MAX_STEPS", "\u0663"),  # ARABIC-INDIC DIGIT THREE: int() would take it
    ("VERONICA_MAX_STEPS", "1.5"),
    ("VERONICA_TIMEOUT_MS", "soon"),
    ("VERONICA_MAX_REPEATS", "0"),
    ("VERONICA_RESERVATION_WAIT_S", "nan"),
    ("VERONICA_RESERVATION_WAIT_S", "-1"),
    ("VERONICA_RESERVATION_WAIT_S", "1e9"),
    ("VERONICA_RESERVATION_WAIT_S", "soon"),
    ("VERONICA_FAIL_OPEN", "maybe"),
    ("VERONICA_GRANT_KEY", "short"),
    ("VERONICA_GRANT_KEY", "\udcff" * 20),  # bytes that were not UTF-8
    ("VERONICA_PROPAGATE_HOSTS", "svc b"),
    ("VERONICA_PROPAGATE_HOSTS", "svc:99999"),
    ("VERONICA_PROPAGATE_HOSTS", "svc:" + "9" * 5000),
    ("VERONICA_PROPAGATE_HOSTS", "svc:\u0663"),
    ("VERONICA_PROPAGATE_HOSTS", "user@svc"),
    ("VERONICA_VENDOR_HOSTS", "a/b"),
    ("VERONICA_UNKNOWN_MODEL_PRICE", "cheap"),
    ("VERONICA_UNKNOWN_MODEL_PRICE", "-1"),
    ("VERONICA_MODEL_ALIASES", "my-deploy"),
    ("VERONICA_MODEL_ALIASES", "a=gpt-4o,A=gpt-4o-mini"),
    ("VERONICA_MODEL_ALIASES", "x" * 5000),
    ("VERONICA_MODEL_ALIASES", "a=b=c"),
    ("VERONICA_CHAIN_ID", "bad id!"),
    ("VERONICA_REDIS_URL", "bogus://nowhere"),
]


@pytest.mark.parametrize(("var", "value"), BAD_VALUES)
@pytest.mark.usefixtures("zero_code")
def test_a_bad_value_refuses_calls_naming_the_variable(var: str, value: str) -> None:
    environ = {"VERONICA_MAX_STEPS": "5", var: value}  # a limit is set: calls are contained
    error = refused_with(environ)
    assert isinstance(error, ValueError)
    message = str(error)
    assert var in message
    assert len(message) < LONGEST_MESSAGE


@pytest.mark.usefixtures("zero_code")
def test_good_values_install_the_default_chain() -> None:
    environ = {
        "VERONICA_MAX_STEPS": "1_000",
        "VERONICA_FAIL_OPEN": "false",
        "VERONICA_GRANT_KEY": "k" * 16,
        "VERONICA_PROPAGATE_HOSTS": "svc:8080, *.internal",
        "VERONICA_UNKNOWN_MODEL_PRICE": "5",
        "VERONICA_MODEL_ALIASES": "my-deploy=gpt-4o,",
    }
    ctx = distro.install_zero_code(environ)
    assert ctx is not None
    assert _propagation.default_context() is ctx
    assert ctx.config.max_steps == 1000


def test_from_env_names_the_variable_directly() -> None:
    with pytest.raises(ValueError, match="VERONICA_MAX_STEPS") as info:
        ExecutionConfig.from_env({"VERONICA_MAX_STEPS": "9" * 5000})
    assert len(str(info.value)) < LONGEST_MESSAGE
    with pytest.raises(ValueError, match="VERONICA_PROPAGATE_HOSTS"):
        Propagation(environ={"VERONICA_PROPAGATE_HOSTS": "svc:" + "9" * 5000})
    with pytest.raises(ValueError, match="VERONICA_GRANT_KEY"):
        Propagation(environ={"VERONICA_GRANT_KEY": "\udcff" * 20})


# -- hostile policy files --------------------------------------------------------------


def hostile(tmp_path: Path, kind: str) -> Path:
    texts = {
        "deep.toml": "x = " + "[" * DEEP + "]" * DEEP,
        "deep_tables.toml": "a = " + "{b=" * 3000 + "1" + "}" * 3000,
        "deep.yaml": "a: " + "[" * DEEP + "]" * DEEP,
        "huge_int.toml": "[limits]\nmax_steps = " + "9" * 5000 + "\n",
        "huge_int.yaml": "limits:\n  max_steps: " + "9" * 5000 + "\n",
        "long_int.toml": "[limits]\nmax_steps = " + "9" * 4000 + "\n",
        "long_key.toml": '[models."' + "m" * 100_000 + '"]\nmax_calls = -1\n',
    }
    path = tmp_path / kind
    path.write_text(texts[kind])
    return path


KINDS = [
    "deep.toml",
    "deep_tables.toml",
    "deep.yaml",
    "huge_int.toml",
    "huge_int.yaml",
    "long_int.toml",
    "long_key.toml",
]


@pytest.mark.parametrize("kind", KINDS)
def test_a_hostile_policy_file_is_a_policy_file_error_naming_it(tmp_path: Path, kind: str) -> None:
    path = hostile(tmp_path, kind)
    with pytest.raises(PolicyFileError) as info:
        PolicyFile(path)
    assert str(info.value).startswith(f"policy file {path}: ")
    assert len(str(info.value)) < LONGEST_MESSAGE + len(str(path))
    with pytest.raises(PolicyFileError) as info:
        PolicyFile.from_env({"VERONICA_POLICY_FILE": str(path)})
    assert str(info.value).startswith(f"policy file {path} (VERONICA_POLICY_FILE): ")
    assert info.value.variable == "VERONICA_POLICY_FILE"
    copy = pickle.loads(pickle.dumps(info.value))
    assert (str(copy), copy.variable) == (str(info.value), "VERONICA_POLICY_FILE")


@pytest.mark.parametrize("kind", ["deep.toml", "deep_tables.toml", "deep.yaml"])
def test_deep_nesting_is_refused_before_parsing_naming_the_depth(tmp_path: Path, kind: str) -> None:
    # Refused by counting brackets, not by the parser's RecursionError after
    # scanning the whole file (PyYAML took seconds over deep.yaml).
    with pytest.raises(
        PolicyFileError, match=r"nested too deeply \(over 64 levels of \[ and \{, line 1\)"
    ):
        PolicyFile(hostile(tmp_path, kind))


@pytest.mark.parametrize("suffix", [".toml", ".yaml"])
def test_nesting_up_to_the_limit_is_left_to_the_parser(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"policy{suffix}"
    deep = "[" * 64 + "]" * 64
    path.write_text(f"x = {deep}\n" if suffix == ".toml" else f"x: {deep}\n")
    with pytest.raises(PolicyFileError, match="is not a known key") as info:
        PolicyFile(path)
    assert "too deeply" not in str(info.value)
    path.write_text(f"\n\nx = [{deep}]\n" if suffix == ".toml" else f"\n\nx: [{deep}]\n")
    with pytest.raises(PolicyFileError, match=r"over 64 levels of .*, line 3"):
        PolicyFile(path)


@pytest.mark.parametrize(
    "text",
    [
        f'# {"[" * 100}\n[tools."web{"[{" * 100}"]\nmax_calls = 3\n',
        f"# {'[' * 100}\n[tools.'web{'[{' * 100}']\nmax_calls = 3\n",
        f'[tools."""web{"[" * 100}"""]\nmax_calls = 3\n',
    ],
    ids=["comment-and-basic-string", "literal-string", "multi-line-string"],
)
def test_brackets_in_strings_and_comments_do_not_nest(tmp_path: Path, text: str) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    try:
        (name,) = PolicyFile(path).current().tools
    except PolicyFileError as error:  # TOML allows no multi-line string as a key
        assert "too deeply" not in str(error)
    else:
        assert name.startswith("web[")
    path = tmp_path / "policy.yaml"
    path.write_text(f"tools:  # {'{' * 100}\n  'web{'[' * 100}''s': {{max_calls: 3}}\n")
    (name,) = PolicyFile(path).current().tools
    assert name == "web" + "[" * 100 + "'s"


@pytest.mark.parametrize("name", ["missing.toml", "with\0nul.toml", "."])
def test_an_unreadable_policy_path_names_the_file_and_variable(tmp_path: Path, name: str) -> None:
    path = f"{tmp_path}/{name}"
    with pytest.raises(PolicyFileError, match=r"cannot be read|unknown extension") as info:
        PolicyFile.from_env({"VERONICA_POLICY_FILE": path})
    assert "(VERONICA_POLICY_FILE)" in str(info.value)


@pytest.mark.usefixtures("zero_code")
def test_zero_code_with_a_hostile_policy_file_refuses_calls_naming_both(tmp_path: Path) -> None:
    path = hostile(tmp_path, "deep.toml")
    error = refused_with({"VERONICA_POLICY_FILE": str(path)})
    assert isinstance(error, PolicyFileError)
    assert f"policy file {path} (VERONICA_POLICY_FILE)" in str(error)
    assert "nested too deeply" in str(error)


def test_a_hostile_new_version_keeps_the_last_good_policy(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text("[limits]\nmax_steps = 3\n")
    clock = FakeClock()
    policy = PolicyFile(path, check_interval_s=1.0, clock=clock)
    path.write_text("x = " + "[" * DEEP + "]" * DEEP)
    clock.advance(2.0)
    assert policy.current().limits.max_steps == 3
    assert policy.version == 1


@pytest.mark.usefixtures("zero_code")
def test_any_other_failure_while_configuring_still_fails_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(environ: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(distro, "_shared_store", broken)
    error = refused_with({"VERONICA_MAX_STEPS": "5"})
    assert isinstance(error, ValueError)
    assert "VERONICA_* configuration could not be loaded (RecursionError" in str(error)


@pytest.mark.parametrize(
    "text",
    [
        "limits:\n  max_steps: 1\n  max_steps: 2\n",  # a key, no value
        "limits:\n  max_steps: -1\n",  # a key and its value
        "[",  # the file as a whole
    ],
)
def test_a_policy_file_error_pickles_to_the_same_message(tmp_path: Path, text: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyFileError) as info:
        PolicyFile.from_env({"VERONICA_POLICY_FILE": str(path)})
    copy = pickle.loads(pickle.dumps(info.value))
    assert str(copy) == str(info.value)
    assert (copy.key, copy.value, copy.variable) == (
        info.value.key,
        info.value.value,
        info.value.variable,
    )
