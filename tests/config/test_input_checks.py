"""The mechanisms behind "one clear error per bad input": user YAML, integer bounds, rates, nulls, registries,
short error values, placement options, output folders and comparable runs."""

from __future__ import annotations

import pickle

import pytest

from piper_sim.cli import main
from piper_sim.config import load_config
from piper_sim.errors import ConfigError, named_by
from piper_sim.registry import Registry
from piper_sim.rundir import UNFINISHED, finish, open_out_dir
from piper_sim.units import read_params
from piper_sim.yamlio import MAX_VALUES, parse_yaml, read_yaml


def error_of(fn, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        fn(*args, **kwargs)
    return err.value


@pytest.mark.parametrize(
    "content,allowed",
    [
        (b"model: \xff\n", "UTF-8"),
        (b"a: b: c\n", "line 1, column 5"),
        (b"[" * 5000 + b"]" * 5000, "nested"),
        (b"[" * 100 + b"]" * 100, "nested at most 64"),
    ],
)
def test_bad_yaml_files_are_one_line_naming_the_key(tmp_path, content, allowed):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    err = error_of(read_yaml, path, "config")
    assert err.key == "config" and allowed in str(err) and "\n" not in str(err)


def test_a_folder_and_an_alias_bomb_are_refused(tmp_path):
    assert "folder" in str(error_of(read_yaml, tmp_path, "topology"))
    bomb = "a0: &a0 [1,1,1,1,1,1,1,1,1,1]\n" + "".join(
        f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
    )
    err = error_of(parse_yaml, bomb, "--set x")
    assert f"{MAX_VALUES:,} values" in str(err) and len(str(err)) < 400


def test_huge_integers_are_refused_before_anything_is_built():
    for key, value in (("parallel.num_microbatches", 10**12), ("sim.seed", 2**64), ("model.d_model", 10**12)):
        section, _, name = key.partition(".")
        raw = {"model": {"preset": "tiny-moe"}, "parallel": {"pp": 2, "ep": 2}}
        raw[section] = {**raw.get(section, {}), name: value}
        assert error_of(load_config, raw).key == key


def test_rates_must_be_positive_and_nulls_only_where_the_default_is_null():
    schema = {"bandwidth_GBps": ..., "latency_us": 1.0, "uplink_GBps": None}
    assert error_of(read_params, {"bandwidth_GBps": 0}, schema, "t.").key == "t.bandwidth_GBps"
    assert error_of(read_params, {"bandwidth_GBps": 1, "latency_us": None}, schema, "t.").key == "t.latency_us"
    assert read_params({"bandwidth_GBps": 1, "uplink_GBps": None}, schema, "t.")["uplink_bytes_per_s"] is None


def test_registries_refuse_unhashable_names():
    reg: Registry[int] = Registry("thing")
    reg.register("a")(1)
    assert error_of(reg.get, ["a"]).key == "thing" and ["a"] not in reg


def test_config_errors_rebuild_from_their_args_and_echo_short_values():
    err = ConfigError("k", list(range(10_000)), "a number")
    assert str(type(err)(*err.args)) == str(err) == str(pickle.loads(pickle.dumps(err)))
    assert len(str(err)) < 200
    with pytest.raises(ConfigError) as renamed, named_by("--grid"):
        raise ConfigError("parallel.pp", 0, "a positive integer")
    assert renamed.value.key == "--grid parallel.pp"


def test_unknown_placement_keys_are_refused_for_every_policy(tmp_path):
    for placement in ({"policy": "contiguous", "bogus": 1}, {"policy": "explicit", "nodes": [0], "seed": 1}):
        assert main(["simulate", "tiny-moe", "--out", str(tmp_path / "o"), "--set", f"placement={placement}"]) == 2


def test_out_folders_are_claimed_by_one_command(tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert "notes.txt" in str(error_of(open_out_dir, foreign, "simulate"))
    out = open_out_dir(tmp_path / "run", "simulate")
    (out / "trace.parquet").write_text("old")
    assert (out / UNFINISHED).exists()
    finish(out)
    open_out_dir(out, "simulate")  # the same command again: the old files go
    assert not (out / "trace.parquet").exists() and (out / UNFINISHED).exists()
    assert "simulate" in str(error_of(open_out_dir, out, "run"))
    assert error_of(open_out_dir, foreign / "notes.txt", "simulate").key == "--out"


def test_compare_refuses_runs_of_different_configs_and_unfinished_runs(tmp_path, capsys):
    a, b, c = (tmp_path / n for n in "abc")
    assert main(["simulate", "tiny-moe", "--out", str(a)]) == 0
    assert main(["simulate", "tiny-moe", "--out", str(b), "--set", "schedule=gpipe"]) == 0
    assert main(["simulate", "tiny-moe", "--out", str(c), "--set", "sim.seed=3"]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 2
    assert "schedule differ" in capsys.readouterr().err
    assert main(["compare", str(a), str(c)]) == 0
    (c / UNFINISHED).write_text("")
    assert main(["compare", str(a), str(c)]) == 2
    assert "did not finish" in capsys.readouterr().err


def test_infinite_numbers_are_refused_where_a_finite_one_is_meant():
    base = {"model": {"preset": "tiny-moe"}, "parallel": {"pp": 2, "ep": 2}}
    for raw, key in (
        ({"migration": {"enabled": True, "threshold": float("inf")}}, "migration.threshold"),
        ({"model": {"preset": "tiny-moe", "published_params": float("inf")}}, "model.published_params"),
    ):
        assert error_of(load_config, {**base, **raw}).key == key


def test_a_null_params_section_is_refused_and_options_are_named_by_their_flag(capsys):
    raw = {
        "model": {"preset": "tiny-moe"},
        "parallel": {"pp": 2, "ep": 2},
        "topology": {"preset": "uniform", "params": None},
    }
    from piper_sim.simulator import simulate

    assert error_of(lambda: simulate(load_config(raw))).key == "topology.params"
    assert main(["validate", "--profile", "/nonexistent.yaml"]) == 2
    assert "--profile cost.profile" in capsys.readouterr().err
    assert main(["schedule", "show", "tiny-moe", "--width", str(10**9)]) == 2


def test_a_long_list_of_allowed_names_stays_one_readable_line():
    from piper_sim.config import load_config
    from piper_sim.errors import ConfigError, one_of

    assert one_of(["b", "a"]) == "one of a, b"
    with pytest.raises(ConfigError) as err:
        load_config({"model": {"preset": "x-moe-small", "num_layer": 1}, "parallel": {"pp": 1, "ep": 8}})
    text = str(err.value)
    assert "closest to 'num_layer': num_layers" in text and len(text) < 400 and "\n" not in text
