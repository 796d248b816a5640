"""Config: validation messages, YAML and flags under the same names, every flag reaches the config."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import cli_here

from ringps.cli.main import build_parser
from ringps.cli.options import config_overrides
from ringps.config import Config, flag, leaf_index, load_config, sections, validate
from ringps.errors import ConfigError


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ringps", *args], capture_output=True, text=True, timeout=120)


def check_one_line(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert expected in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--workers", "0"], "--workers 0: must be >= 1"),
        (["--strategy", "nope"], "unknown strategy 'nope'; known: allreduce"),
        (["--lr", "abc"], "--lr abc: must be a number"),
        (["--slowdown", "1,2", "--workers", "4"], "--slowdown has 2 factors for --workers 4"),
        (["--slowdown", "1,0.5"], "--slowdown 1,0.5: every factor must be >= 1"),
        (["--dataset", "imagenet"], "--dataset imagenet: unknown dataset"),
        (["--net", "fast"], "--net fast: 'fast' is not a rate"),
        (["--config", "/nonexistent.yaml"], "--config /nonexistent.yaml: no such file"),
        (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
        (["--out", "/proc/nope"], "--out /proc/nope: cannot write the run folder there"),
        (["--resume", "/nonexistent"], "--resume /nonexistent: no such checkpoint folder"),
        (["--strategy", "ps-async", "--optimizer", "adam"], "the parameter servers run momentum SGD"),
        (["--value-dtype", "fp8"], "--value-dtype fp8: must be one of"),
        (["--local-period", "0"], "--local-period 0: must be >= 1"),
        (["--density", "1.5"], "--density 1.5: must be <= 1"),
        (["--strategy", "ps-vsgd", "--vsgd-weight", "cubic:1"], "unknown weight function 'cubic'"),
        (["--workers", "300"], "--workers 300: must be <= 256"),
        (["--model", "vgg"], "unknown model 'vgg'"),
        (["--dataset", "folder:/nonexistent"], "/nonexistent"),
        (["--strategy", "ps-threshold", "--staleness-threshold", "-1"], "--staleness-threshold -1: must be >= 0"),
        (["--diloco-outer-momentum", "1"], "--diloco-outer-momentum 1: must be < 1"),
        (["--exchange", "nope"], "--exchange nope: unknown exchange 'nope'; known:"),
        (["--memory", "sgd"], "--memory sgd: unknown memory 'sgd'; known: ef"),
        (["--strategy", "ps-async", "--backend", "nccl"], "--backend nccl: the parameter servers speak gloo"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, args, expected):
    check_one_line(*cli_here(capsys, "train", *args), expected)


@pytest.mark.parametrize("args, expected", [
    (["--workers", "0"], "--workers 0: must be >= 1"),
    (["--no-such-flag", "1"], "unrecognized arguments: --no-such-flag 1"),
    (["--dataset", "folder:/nonexistent"], "/nonexistent"),
    (["--strategy", "ps-async", "--optimizer", "adam"], "the parameter servers run momentum SGD"),
])
def test_bad_input_is_one_line_and_exit_2_in_a_process_of_its_own(args, expected):
    r = cli("train", *args)
    check_one_line(r.returncode, r.stderr, expected)


def test_bad_yaml_value_names_the_option(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("train:\n  epochs: -3\n")
    r = cli("train", "--config", str(f))
    assert r.returncode == 2 and r.stderr.strip() == "ringps: --epochs -3: must be >= 1"
    f.write_text("strategy:\n  epochs: 3\n")
    r = cli("train", "--config", str(f))
    assert r.returncode == 2 and "strategy.epochs: unknown option" in r.stderr


def test_yaml_nested_or_flat_and_flags_override(tmp_path):
    f = tmp_path / "run.yaml"
    f.write_text("train:\n  epochs: 3\n  lr: 0.5\nworkers: 2\nslowdown: [1, 3]\n")
    cfg = load_config(str(f), {"lr": "0.25"})
    assert (cfg.train.epochs, cfg.train.lr, cfg.run.workers, cfg.run.slowdown) == (3, 0.25, 2, [1.0, 3.0])


def test_every_config_key_has_a_flag_that_reaches_it():
    """Give every flag a non-default value; each must land on its own key."""
    parser = build_parser()
    argv = ["train"]
    expected = {}
    for sec, cls in sections().items():
        for leaf, f in cls.model_fields.items():
            ann = f.annotation
            if ann is bool or ann == (bool | None):
                argv.append(flag(leaf) if not f.default else "--no-" + leaf.replace("_", "-"))
                expected[leaf] = not f.default
    args = parser.parse_args(argv)
    got = config_overrides(args)
    assert got == expected
    # non-boolean flags: each flag name is exactly the key name
    index = leaf_index()
    for action in parser._subparsers._group_actions[0].choices["train"]._actions:
        if action.dest in index:
            assert action.option_strings[0] == flag(action.dest)
    assert set(index) <= {a.dest for a in parser._subparsers._group_actions[0].choices["train"]._actions}


def test_values_from_flags_convert_like_yaml():
    cfg = validate({"slowdown": "1,1,2,4", "synthetic_shape": "3,16,16", "epochs": "7", "augment": False})
    assert cfg.run.slowdown == [1, 1, 2, 4] and cfg.data.synthetic_shape == [3, 16, 16]
    assert cfg.train.epochs == 7 and cfg.data.augment is False
    assert Config().run.workers == 4


def test_unknown_key_is_refused():
    with pytest.raises(ConfigError, match="--bogus: unknown option"):
        validate({"bogus": 1})


def test_list_names_every_registry():
    """`ringps list` shows what a user can pass: every exchange and policy, not only strategies."""
    from ringps.comm.exchanges import EXCHANGES
    from ringps.ps import POLICIES

    out = cli("list")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.replace("│", " ").split())
    for name in [*EXCHANGES.names(), *POLICIES.names(), "facenet", "orl-faces"]:
        assert name in text, name


def test_auto_backend_is_nccl_on_cuda_but_gloo_for_parameter_servers(monkeypatch):
    """A GPU host: DDP strategies get NCCL; a parameter-server job gloo (its tagged point-to-point
    and any-source receives are gloo's), where NCCL would fail at its first receive."""
    import torch

    from ringps.launch.worker import pick_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_backend(validate({"strategy": "ring-topk"})) == "nccl"
    assert pick_backend(validate({"strategy": "ps-threshold"})) == "gloo"
    assert pick_backend(validate({"strategy": "ring-topk", "backend": "gloo"})) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_backend(validate({"strategy": "allreduce"})) == "gloo"
    # --strategy auto under torchrun forms its group before it chooses: the host's backend
    assert pick_backend(validate({"strategy": "auto"})) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_backend(validate({"strategy": "auto"})) == "nccl"
