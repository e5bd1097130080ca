"""hermetic.yaml: schema errors name the key path (exit 2, no traceback); the hash is canonical."""

from __future__ import annotations

import json
import os

import pytest

from conftest import assert_clean_error, run_cli

BASE = "hermetic/debian-bookworm-python3@sha256:" + "a" * 64

BLOCK_STYLE = f"""\
name: demo
base: {BASE}
python:
  path: /usr/bin/python3
  version: "3.11"
determinism:
  mode: strict
  seed: 7
  threads: 2
env:
  FOO: bar
datasets:
  - name: train
    path: ./data/
    manifest: data.sha256
    mount: /data/train
"""

FLOW_STYLE = f"""\
# same settings, other order and style
datasets: [{{mount: "/data/train/", manifest: "data.sha256", path: "data", name: "train"}}]
env: {{"FOO": "bar"}}
determinism: {{threads: 2, seed: 7, mode: "strict"}}
python: {{version: '3.11', path: '/usr/bin/python3'}}
base: '{BASE}'
name: "demo"
runs_dir: runs
"""


def write(tmp_path, text, name="a"):
    d = tmp_path / name
    d.mkdir()
    (d / "hermetic.yaml").write_text(text)
    return d


def show(d):
    proc = run_cli("config", "show", "--json", "-C", str(d))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_same_config_other_order_and_style_same_hash(tmp_path):
    a = show(write(tmp_path, BLOCK_STYLE, "a"))
    b = show(write(tmp_path, FLOW_STYLE, "b"))
    assert a["sha256"] == b["sha256"]
    assert a["config"] == b["config"]
    assert a["config"]["runs_dir"] == "runs" and a["config"]["datasets"][0]["path"] == "data"


def test_changed_value_changes_hash(tmp_path):
    a = show(write(tmp_path, BLOCK_STYLE, "a"))
    b = show(write(tmp_path, BLOCK_STYLE.replace("seed: 7", "seed: 8"), "b"))
    assert a["sha256"] != b["sha256"]


def test_text_output_shows_hash(tmp_path):
    d = write(tmp_path, BLOCK_STYLE)
    proc = run_cli("config", "show", "-C", str(d))
    assert proc.returncode == 0
    assert "# sha256: " in proc.stdout and "mode: strict" in proc.stdout


@pytest.mark.parametrize("text,needles", [
    (BLOCK_STYLE + "colour: blue\n", ["colour", "unknown key", ":17"]),
    (BLOCK_STYLE.replace("threads: 2", "threads: two"), ["determinism.threads", "integer", ":9"]),
    (BLOCK_STYLE.replace("mode: strict", "mode: loose"), ["determinism.mode", "strict", "statistical"]),
    (BLOCK_STYLE.replace("    mount: /data/train", "    mount: data"), ["datasets[0].mount", "absolute"]),
    (BLOCK_STYLE.replace("    manifest: data.sha256\n", ""), ["datasets[0].manifest", "required"]),
    (BLOCK_STYLE.replace(BASE, "python:3.11-slim"), ["base", "hermetic base pin python:3.11-slim"]),
    (BLOCK_STYLE.replace('version: "3.11"', "version: 3.11"), ["python.version", "string"]),
    (BLOCK_STYLE.replace("env:\n  FOO: bar", "env:\n  1FOO: bar"), ["env", "1FOO"]),
    (BLOCK_STYLE + "run:\n  shm_size: 2x\n", ["run.shm_size", "512m or 8g", ":18"]),
    (BLOCK_STYLE + "run:\n  tmp_size: 0g\n", ["run.tmp_size", "whole number"]),
    (BLOCK_STYLE + "run:\n  tmp_size: 1.5g\n", ["run.tmp_size", "512m or 8g"]),
    (BLOCK_STYLE + "run:\n  memroy: 8g\n", ["run.memroy", "unknown key"]),
    (BLOCK_STYLE + "run:\n  memory: 8x\n", ["run.memory", "512m or 8g"]),
    ("name: [unclosed\n", ["invalid YAML"]),
    ("- just\n- a list\n", ["top level must be a mapping"]),
])
def test_bad_config_is_a_clear_error(tmp_path, text, needles):
    d = write(tmp_path, text)
    proc = run_cli("config", "show", "-C", str(d))
    assert_clean_error(proc, 78, "hermetic.yaml", *needles)


def test_missing_config_file(tmp_path):
    proc = run_cli("config", "show", "-C", str(tmp_path))
    assert_clean_error(proc, 78, "no such config file", "hermetic init")
    nowhere = tmp_path / "a" / "b"
    nowhere.mkdir(parents=True)
    proc = run_cli("config", "show", cwd=nowhere)
    assert_clean_error(proc, 78, "no such config file, here or in a parent directory", "hermetic init")


def test_commands_find_the_project_from_a_subdirectory_as_git_does(tmp_path):
    project = write(tmp_path, "name: up\nbase: docker:sha256:" + "0" * 64 + "\nruns_dir: my-runs\n")
    sub = project / "src" / "deep"
    sub.mkdir(parents=True)
    shown = run_cli("config", "show", "--json", cwd=sub)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["config"]["name"] == "up"
    from hermetic.record.locate import runs_root

    old = os.getcwd()
    try:
        os.chdir(sub)
        assert runs_root(None, None) == (project / "my-runs").resolve()
    finally:
        os.chdir(old)


def test_run_sizes_default_and_normalize_and_stay_out_of_the_image(tmp_path):
    """run.* sizes the container of `hermetic run`, not the image: the build key does not see them."""
    from pathlib import Path

    from hermetic.builder.key import image_config_sha256
    from hermetic.config.load import parse_config

    plain = parse_config(BLOCK_STYLE, Path(tmp_path / "hermetic.yaml"))
    assert (plain.model.run.shm_size, plain.model.run.tmp_size) == ("1g", "4g")
    sized = parse_config(BLOCK_STYLE + "run:\n  shm_size: 8G\n  tmp_size: 512m\n", Path(tmp_path / "hermetic.yaml"))
    assert (sized.model.run.shm_size, sized.model.run.tmp_size) == ("8g", "512m")
    assert sized.sha256 != plain.sha256  # recorded with every run: a replay gets the same container
    assert image_config_sha256(sized) == image_config_sha256(plain)


def test_pin_writes_the_base_line_and_adds_it_when_there_is_none(tmp_path):
    from hermetic.builder.pin import pin_base

    ref = "hermetic/debian-bookworm-python3@sha256:" + "1" * 64
    cfg = tmp_path / "hermetic.yaml"
    cfg.write_text("name: x  # mine\nlock: requirements.lock\n")
    assert pin_base(cfg, ref) == (None, True)
    assert cfg.read_text() == f"name: x  # mine\nbase: {ref}\nlock: requirements.lock\n"
    assert pin_base(cfg, ref) == (ref, False)
    other = ref.replace("1" * 64, "2" * 64)
    cfg.write_text(f"name: x\nbase: {ref}   # pinned\n")
    assert pin_base(cfg, other) == (ref, True) and cfg.read_text() == f"name: x\nbase: {other}   # pinned\n"


# ---------------------------------------------------------------- bounds and secrets (issue 24, items 8 and 9)

def test_a_config_over_the_size_bound_is_refused_unread(tmp_path):
    from hermetic.config.load import CONFIG_MAX_BYTES

    d = write(tmp_path, BLOCK_STYLE + "# " + "x" * CONFIG_MAX_BYTES + "\n")
    size = (d / "hermetic.yaml").stat().st_size
    proc = run_cli("config", "show", "-C", str(d), timeout=60)
    assert_clean_error(proc, 78, f"{d / 'hermetic.yaml'}: {size} bytes", "at most 1048576 bytes (1 MiB)")
    for fast in (["runs", "-C", str(d)], ["runs", "show", "nothing", "-C", str(d)]):  # the fast path too
        proc = run_cli(*fast, timeout=60)
        assert_clean_error(proc, 78, f"{size} bytes")


def test_a_config_just_under_the_bound_loads(tmp_path):
    from pathlib import Path

    from hermetic.config.load import parse_config
    from hermetic.config.load import CONFIG_MAX_BYTES

    comment = "# " + "x" * (CONFIG_MAX_BYTES - len(BLOCK_STYLE) - 4) + "\n"
    text = BLOCK_STYLE + comment
    assert len(text.encode()) <= CONFIG_MAX_BYTES
    assert parse_config(text, Path(tmp_path / "hermetic.yaml")).model.name == "demo"


BILLION_LAUGHS = "".join(
    [f"l0: &l0 {['lol'] * 9}\n"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)])


@pytest.mark.parametrize("text, line, alias", [
    (BLOCK_STYLE + BILLION_LAUGHS, 18, "*l0"),  # 9^10 strings once expanded: refused at the first alias
    (BLOCK_STYLE.replace("name: demo", "name: &n demo") + "runs_dir: *n\n", 17, "*n"),
    (BLOCK_STYLE.replace("env:\n  FOO: bar", "env: &e\n  FOO: bar") + "run:\n  <<: *e\n", 18, "*e"),
])
def test_yaml_aliases_are_refused(tmp_path, text, line, alias):
    d = write(tmp_path, text)
    proc = run_cli("config", "show", "-C", str(d), timeout=60)
    assert_clean_error(proc, 78, f"hermetic.yaml:{line}: invalid YAML: {alias}: hermetic.yaml takes no aliases")


def test_an_anchor_without_an_alias_and_deep_nesting(tmp_path):
    from pathlib import Path

    from hermetic.config.load import parse_config
    from hermetic.core.errors import ConfigError

    cfg = Path(tmp_path / "hermetic.yaml")
    assert parse_config(BLOCK_STYLE.replace("name: demo", "name: &n demo"), cfg).model.name == "demo"
    for depth in (5_000, 200_000):
        with pytest.raises(ConfigError, match="invalid YAML"):
            parse_config(BLOCK_STYLE + "x: " + "[" * depth + "]" * depth + "\n", cfg)


@pytest.mark.parametrize("text, line, key, value", [
    (BLOCK_STYLE.replace("  FOO: bar", "  FOO: bar\n  HF_TOKEN: hf_live_value_1"), 12, "env.HF_TOKEN", "hf_live_value_1"),
    (BLOCK_STYLE.replace("  FOO: bar", "  wandb_api_key: wandb_value_2"), 11, "env.wandb_api_key", "wandb_value_2"),
    (BLOCK_STYLE.replace("  threads: 2", "  threads: 2\n  env:\n    DB_PASSWORD: pw_value_3"), 11,
     "determinism.env.DB_PASSWORD", "pw_value_3"),
    (FLOW_STYLE.replace('env: {"FOO": "bar"}', 'env: {"FOO": "bar", "AWS_SECRET_ACCESS_KEY": "aws_value_4"}'), 3,
     "env.AWS_SECRET_ACCESS_KEY", "aws_value_4"),
])
def test_a_secret_under_env_is_refused_with_the_run_time_way(tmp_path, text, line, key, value):
    d = write(tmp_path, text)
    proc = run_cli("config", "show", "-C", str(d), timeout=60)
    name = key.rsplit(".", 1)[1]
    assert_clean_error(proc, 78, f"hermetic.yaml:{line}: {key}: looks like a secret",
                       f"pass it at run time: hermetic run --env {name} (NAME alone takes the value")
    assert value not in proc.stdout + proc.stderr


def test_the_config_refuses_secrets_by_the_rule_the_record_uses():
    from hermetic.record import is_secret_name as record_rule
    from hermetic.config.secretnames import is_secret_name

    assert record_rule is is_secret_name


def test_without_libyaml_the_same_refusals(tmp_path, monkeypatch):
    """PyYAML's pure-Python loader (where libyaml is missing) composes aliases the same way; its deep
    nesting ends in Python's recursion limit, refused as invalid YAML too."""
    from pathlib import Path

    import yaml

    import hermetic.config.load as config
    from hermetic.core.errors import ConfigError

    monkeypatch.setattr(config, "_YamlLoader", yaml.SafeLoader)
    cfg = Path(tmp_path / "hermetic.yaml")
    assert config.parse_config(BLOCK_STYLE, cfg).model.name == "demo"
    with pytest.raises(ConfigError, match=r"hermetic\.yaml:18: invalid YAML: \*l0: hermetic\.yaml takes no aliases"):
        config.parse_config(BLOCK_STYLE + BILLION_LAUGHS, cfg)
    with pytest.raises(ConfigError, match="invalid YAML: nested too deeply"):
        config.parse_config(BLOCK_STYLE + "x: " + "[" * 5000 + "]" * 5000 + "\n", cfg)
